"""What rnnc.LSTM (numpy or torch) and rnnc.nn.LSTM (torch) share: the initial states torch.nn
takes as hx, checked against the shapes it expects, a PackedSequence out of a padded output, and
whether autograd records a call."""

import sys

import numpy as np


def records_gradients(*values):
    """Whether torch's autograd would record a call on these values (grad mode on and one of them
    a tensor that requires grad; a PackedSequence by its data). rnnc's inference would cut the
    graph there: such calls run the training forward and its backward instead."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.is_grad_enabled():
        return False
    for value in values:
        if isinstance(value, torch.Tensor):
            if value.requires_grad:
                return True
        elif value is not None and type(value) is not np.ndarray:
            rnn_utils = sys.modules.get("torch.nn.utils.rnn")
            if (rnn_utils is not None and isinstance(value, rnn_utils.PackedSequence)
                    and value.data.requires_grad):
                return True
    return False


def state_shapes(module, lstm, batch):
    """Each state's [num_layers * num_directions, batch, features], by name ("h", and "c")."""
    slots = module.num_layers * (2 if module.bidirectional else 1)
    shapes = {"h": [slots, batch, module.proj_size or module.hidden_size]}
    if lstm:
        shapes["c"] = [slots, batch, module.hidden_size]
    return shapes


def given_states(lstm, hx):
    """hx as torch.nn takes it ((h_0, c_0) for an LSTM, h_0 otherwise) as (name, label, value)."""
    if not lstm:
        return [("h", "hx (h_0)", hx)]
    if not isinstance(hx, (tuple, list)) or len(hx) != 2:
        raise ValueError("LSTM expects hx as a tuple (h_0, c_0)")
    return [("h", "hx[0] (h_0)", hx[0]), ("c", "hx[1] (c_0)", hx[1])]


def check_state_shape(label, shape, expected):
    if list(shape) != list(expected):
        raise ValueError(f"{label} has shape {list(shape)}, expected {list(expected)} "
                         "[num_layers * num_directions, batch, features]")


def repack(y, packed_input, batch_first):
    """The padded output y (the caller's batch order) as a PackedSequence laid out as
    packed_input: step t's rows are the first batch_sizes[t] sequences in sorted order.
    Indexing, so autograd flows through it."""
    import torch
    from torch.nn.utils.rnn import PackedSequence

    batch_sizes = packed_input.batch_sizes
    order = packed_input.sorted_indices
    if order is None:
        order = torch.arange(int(batch_sizes[0]))
    steps = torch.repeat_interleave(torch.arange(len(batch_sizes)), batch_sizes)
    sequences = order[torch.cat([torch.arange(int(n)) for n in batch_sizes])]
    data = y[sequences, steps] if batch_first else y[steps, sequences]
    return PackedSequence(data, batch_sizes, packed_input.sorted_indices,
                          packed_input.unsorted_indices)
