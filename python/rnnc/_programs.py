"""The compiled programs rnnc.nn's modules keep between calls, while their parameters keep their
values, and the calls that build and run them."""

import torch

from . import _rnnc


class _ProgramCache:
    """A module's program kept between calls while its parameters keep their values: the
    inference program (rnnc's Layer: no tape, weights packed once) for calls that autograd does
    not record, such as evaluation under torch.no_grad() (the training forward builds a program
    and packs the weights at every call: a batch-1 LSTM, I=H=512, 8.5 ms a call, against 5.9
    with this program); and a one-step cell's training program, which a loop stepping the cell
    calls many times between optimiser steps. It is built from a copy of the parameters and kept
    while they equal that copy: torch's version counter misses writes through ``p.data``
    (hand-written optimisers, EMA updates), so the check compares the values, a read of the
    weights once a call (memcmp: about 0.2 ms for the 8 MB of that LSTM)."""

    attributes = ("_rnnc_inference", "_rnnc_training")

    def __init__(self, attribute):
        assert attribute in self.attributes
        self._attribute = attribute

    def get(self, module, params, build, key=None):
        """The program for `params` (float32 tensors) and `key` (whatever else the program is
        built with: the training flag, a dropout's seed); build(weights) makes one from numpy
        arrays."""
        cached = module.__dict__.get(self._attribute)
        if cached is not None:
            cached_key, copies, program = cached
            if cached_key == key and len(copies) == len(params) and all(
                    _same(p, c) for p, c in zip(params, copies)):
                return program
        copies = [p.detach().clone() for p in params]
        program = build([c.numpy() for c in copies])
        module.__dict__[self._attribute] = (key, copies, program)
        return program

    @classmethod
    def without(cls, state):
        """A module's pickled state without its programs (copies build their own)."""
        state = dict(state)
        for attribute in cls.attributes:
            state.pop(attribute, None)
        return state


def _same(param, copy):
    """Whether a float32 parameter holds its copy's values, bit for bit (a NaN weight equals
    itself: torch.equal would rebuild at every call)."""
    if param.shape != copy.shape:
        return False
    if param.dtype == torch.float32 and param.device.type == "cpu" and param.is_contiguous():
        return _rnnc.same_bytes(param.detach().numpy(), copy.numpy())
    return torch.equal(param, copy)


_inference_programs = _ProgramCache("_rnnc_inference")
_training_programs = _ProgramCache("_rnnc_training")


def _infer(layer, x, state_names, states, lengths, sides=None):
    """y and the final states by the inference program, as torch tensors."""
    given = {name: t.detach().contiguous().numpy()
             for name, t in zip(state_names, states) if t is not None}
    sides = {name: t.detach().contiguous().numpy() for name, t in (sides or {}).items()}
    y, finals = layer.forward(x.detach().contiguous().numpy(), given, lengths, sides)
    return torch.from_numpy(y), [torch.from_numpy(finals[name]) for name in state_names]


def _program(make, module, cell, weights, sizes, *training_args, layout=None,
             **training_options):
    """rnnc's inference Layer (make=_rnnc.Layer) or Training program for one of these modules:
    the cell, numpy weights and sizes given, the options the module's, and its layout
    (num_layers, bidirectional, batch_first) unless given (a cell's: one step of one layer)."""
    layout = layout or (module.num_layers, module.bidirectional, module.batch_first)
    return make(cell, weights, sizes, *layout, module._rnnc_options["jit"],
                module._rnnc_options["threads"], module._rnnc_options["target_cpu"],
                *training_args, **training_options)
