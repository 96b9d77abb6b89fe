"""The dropout masks a training call of rnnc drew, as torch tensors, for its forward replayed in
torch's operations (a second derivative through dropout: _autograd.torch_recurrence).

rnnc's masks are pure functions of the call's seed and their coordinates (runtime/exec/Hash.h),
drawn here by the runtime's own code (_rnnc.dropout_mask, _rnnc.between_layers_mask); what this
module adds is where each value of the replay sits among those coordinates: a cell's dropout
draws mask row r for the r-th row its direction runs, step after step in the order it runs them
(runtime/layers/DirectionRun.cpp), and the dropout between layers one value per element of the
layer's output, time-major."""

import numpy as np
import torch

from . import _rnnc


def mask_rows(steps, batch, lengths, reverse):
    """[T, B] int64: the mask row that step t of sequence b takes in a direction's run, -1 past
    the sequence's length. Whole sequences run step after step, all B rows at each (in reverse
    from the last step); with lengths, the sequences run longest first (a stable sort), each
    step's active ones in that order, a reversed one from its own last step."""
    rows = np.full((steps, batch), -1, dtype=np.int64)
    if lengths is None or all(int(n) == steps for n in lengths):
        order = np.arange(steps * batch, dtype=np.int64).reshape(steps, batch)
        rows[:] = order[::-1] if reverse else order
        return rows
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    first = 0
    for step in range(steps):
        active = order[:int((lengths > step).sum())]
        times = lengths[active] - 1 - step if reverse else np.full(len(active), step)
        rows[times, active] = first + np.arange(len(active))
        first += len(active)
    return rows


class CellMasks:
    """The masks of one direction of one layer (slot `slot`) of a call seeded `seed`: for each
    of its cell's dropouts (numbered as rnnc numbers them: in the cell's order, from 0), the
    mask of step t, or the one mask of a dropout of parameters alone (a weight's: DropConnect),
    drawn once per call from the parameter's rows."""

    def __init__(self, seed, slot, rows):
        self.seed = seed + slot  # each slot's masks from its own seed (LayerOptions::maskSeedOf)
        self.rows = rows
        self.drawn = {}

    def of_rows(self, stream, p, width, step):
        if stream not in self.drawn:
            self.drawn[stream] = torch.from_numpy(
                _rnnc.dropout_mask(self.seed, stream, self.rows, width, p))
        return self.drawn[stream][step]

    def of_parameter(self, stream, p, shape):
        if stream not in self.drawn:
            columns = shape[-1] if shape else 1
            rows = np.arange(int(np.prod(shape, dtype=np.int64)) // max(columns, 1))
            self.drawn[stream] = torch.from_numpy(
                _rnnc.dropout_mask(self.seed, stream, rows, columns, p)).reshape(shape)
        return self.drawn[stream]


def between_layers(y, layer, p, seed, batch_first):
    """y, the output of layer `layer` (not the last), times the mask of the dropout between it
    and the next layer, as rnnc drew it for the call seeded `seed`."""
    steps, batch = (y.shape[1], y.shape[0]) if batch_first else (y.shape[0], y.shape[1])
    mask = torch.from_numpy(_rnnc.between_layers_mask(steps, batch, y.shape[-1], p, seed, layer))
    return y * (mask.transpose(0, 1) if batch_first else mask)
