"""rnnc.nn's layers as one torch operator, ``rnnc::forward``, so that TorchScript sees them.

torch.jit.trace records the operators a call dispatches, and rnnc's calls run in C++ on numpy
views: traced as they are, a layer's output would be recorded as a constant, and the traced model
would give the traced input's output for every input. Under tracing (and in their TorchScript
forward) rnnc.nn's modules call this operator instead, whose arguments are the tensors (input,
states, lengths, side inputs, parameters) and a JSON ``spec`` naming the cell, its sizes, the
layout and rnnc's options. A traced or scripted model then runs rnnc on what it is given, its
parameters read at each call, and ``torch.jit.save`` keeps it; ``torch.jit.load`` needs ``import
rnnc.nn`` first, which defines the operator.

The kernel is registered as CompositeImplicitAutograd, in Python: it runs below the tracer (so
the trace records the operator, not what it calls) and above autograd, so that where autograd
records the call it runs rnnc's training forward as a torch.autograd.Function, and a traced or
scripted model trains as the module does (without dropout: its masks are drawn per call)."""

import json
import threading
import warnings
from collections import OrderedDict

import torch
import torch.library

from . import _rnnc
from ._autograd import _Recurrence
from ._programs import _infer, _inference_programs, _program, _training_programs
from ._recurrent import records_gradients

_SCHEMA = ("forward(str spec, Tensor x, Tensor[] states, Tensor? lengths, Tensor[] sides, "
           "Tensor[] params) -> Tensor[]")


def spec(cell, sizes, layout, names, state_names, side_names, options):
    """The operator's spec: everything a program is built from besides the weights. ``cell`` is
    a built-in name, a path or the cell's source (a model saved with torch.jit.save carries the
    source, so a .cell file is read here); layout is (num_layers, bidirectional, batch_first)."""
    return json.dumps(dict(cell=cell, sizes=sizes, layout=list(layout), names=list(names),
                           states=list(state_names), sides=list(side_names),
                           options=dict(options)), sort_keys=True)


class _Stand:
    """What _program and the program caches read of a module, from a spec: one per spec and set
    of parameter tensors (their storage), so that two layers of one spec in a model keep a
    program each."""

    def __init__(self, spec_text):
        parsed = json.loads(spec_text)
        self.cell, self.sizes = parsed["cell"], parsed["sizes"]
        self.num_layers, self.bidirectional, self.batch_first = parsed["layout"]
        self.names, self.state_names = parsed["names"], parsed["states"]
        self.side_names = parsed["sides"]
        self._rnnc_options = parsed["options"]

    def build(self, make, *training_args, **training_options):
        return lambda weights: _program(make, self, self.cell, dict(zip(self.names, weights)),
                                        self.sizes, *training_args, **training_options)


_STANDS_KEPT = 8  # programs for this many (spec, parameters) pairs, least recently used out
_stands = OrderedDict()
_stands_lock = threading.Lock()


def _stand(spec_text, params):
    key = (spec_text, tuple(p.data_ptr() for p in params))
    with _stands_lock:
        stand = _stands.get(key)
        if stand is None:
            stand = _stands[key] = _Stand(spec_text)
            while len(_stands) > _STANDS_KEPT:
                _stands.popitem(last=False)
        else:
            _stands.move_to_end(key)
        return stand


def _forward(spec_text, x, states, lengths, sides, params):
    """The kernel: x [T, B, I] (as the layout's batch_first says), every initial state and side
    input and the parameters, float32; returns [y, *final states]."""
    stand = _stand(spec_text, params)
    if len(states) != len(stand.state_names) or len(sides) != len(stand.side_names) \
            or len(params) != len(stand.names):
        raise ValueError(f"rnnc::forward takes {len(stand.state_names)} states, "
                         f"{len(stand.side_names)} side inputs and {len(stand.names)} "
                         f"parameters; given {len(states)}, {len(sides)} and {len(params)}")
    x = x.float()
    states = [s.float() for s in states]
    sides = [s.float() for s in sides]
    params = [p.float() for p in params]
    lens = None if lengths is None else lengths.cpu().numpy().astype("int64")
    if not records_gradients(x, *states, *sides, *params):
        layer = _inference_programs.get(stand, stand.names, params, stand.build(_rnnc.Layer))
        y, finals = _infer(layer, x, stand.state_names, states, lens,
                           dict(zip(stand.side_names, sides)))
        return [y, *finals]
    program = _training_programs.get(stand, stand.names, params,
                                     stand.build(_rnnc.Training, 0.0, 0, training=False))
    y, *finals = _Recurrence.apply(program, stand.state_names, stand.side_names, stand.names,
                                   None, x, lens, 0, *states, *sides, *params)
    return [y, *finals]


def _kernel(*args):
    try:
        return _forward(*args)
    except Exception as error:
        # torch 1.13's TorchScript interpreter (a traced or scripted model's call) drops the
        # message of an exception raised in a Python kernel: say it as a warning too.
        warnings.warn(f"rnnc::forward: {type(error).__name__}: {error}", RuntimeWarning)
        raise


_library = torch.library.Library("rnnc", "DEF")
_library.define(_SCHEMA)
_library.impl("forward", _kernel, "CompositeImplicitAutograd")


def tracing():
    """Whether torch.jit.trace is recording this call."""
    return torch._C._get_tracing_state() is not None
