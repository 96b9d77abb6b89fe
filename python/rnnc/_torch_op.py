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
scripted model trains as the module does. In training, where the module draws dropout masks
(between layers, or a cell's own), its spec says so (``training_dropout``): each call then draws
its masks from a seed of torch's generator, as the module's eager call does, so that under
torch.manual_seed a traced or scripted model gives the eager module's results."""

import json
import re
import threading
import warnings
from collections import OrderedDict

import torch
import torch.library

from . import _rnnc
from ._autograd import TORCH_RECURRENCES, _Recurrence, torch_recurrence
from ._programs import _infer, _inference_programs, _program, _training_programs
from ._recurrent import records_gradients

_SCHEMA = ("forward(str spec, Tensor x, Tensor[] states, Tensor? lengths, Tensor[] sides, "
           "Tensor[] params) -> Tensor[]")


def spec(cell, sizes, layout, names, state_names, side_names, options, input_size_name=None,
         training_dropout=None, seed=None):
    """The operator's spec: everything a program is built from besides the weights. ``cell`` is
    a built-in name, a path or the cell's source (a model saved with torch.jit.save carries the
    source, so a .cell file is read here); layout is (num_layers, bidirectional, batch_first).
    ``input_size_name``: the size that is the input's width (x's at each call), which the cell's
    forward in torch's operations needs (a second derivative through a custom cell).
    ``training_dropout``: a call in training that draws dropout masks (the cell's, and this p
    between layers), from ``seed`` where given, else from a seed each call draws."""
    fields = dict(cell=cell, sizes=sizes, layout=list(layout), names=list(names),
                  states=list(state_names), sides=list(side_names), options=dict(options))
    if input_size_name is not None:
        fields["input_size"] = input_size_name
    if training_dropout is not None:
        fields["training_dropout"] = float(training_dropout)
        if seed is not None:
            fields["seed"] = int(seed)
    return json.dumps(fields, sort_keys=True)


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
        self.input_size_name = parsed.get("input_size")
        if self.input_size_name is None and self.cell not in TORCH_RECURRENCES:
            self.input_size_name = _input_size_of(self.cell, self.sizes)  # an older spec's
        self.training_dropout, self.seed = parsed.get("training_dropout"), parsed.get("seed")
        self.masks_at_build = False  # whether its program draws a weight's mask when built

    def build(self, make, *training_args, **training_options):
        return lambda weights: _program(make, self, self.cell, dict(zip(self.names, weights)),
                                        self.sizes, *training_args, **training_options)


def _input_size_of(cell, sizes):
    """The size that is the cell's input's width, read from the cell (specs written before
    they named it, in models saved then), or None where its input's width is no one size."""
    try:
        return _rnnc.cell_signature(cell, sizes)["input_size"]
    except Exception:  # sizes the cell does not take: a spec of another cell's, refused later
        return None


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


# torch.nn's recurrent modules' cells, as rnnc names them, and as torch's ONNX helper
# (_generic_rnn) takes them.
TORCH_CELLS = {cell: cell.upper() for cell in TORCH_RECURRENCES}


def empty_results(x, states, params, width):
    """What torch.nn's modules give for a batch of no sequences (x [T, 0, I], or [0, T, I] with
    batch_first): empty outputs of `width` features and final states, which autograd connects
    to the input, the initial states and the parameters, so that a backward through them gives
    zero gradients (rnnc's runtime takes batches of one sequence and more)."""
    anchor = sum((t.sum() for t in (x, *states, *params)), x.new_zeros(())) * 0
    y = x.new_zeros(tuple(x.shape[:2]) + (width,)) + anchor
    return [y] + [s.new_zeros(s.shape) + anchor for s in states]


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
    if x.shape[0 if stand.batch_first else 1] == 0 and stand.cell in TORCH_CELLS:
        if x.shape[-1] != params[0].shape[1]:  # weight_ih_l0 [gates, input_size]
            raise ValueError(f"input has shape {list(x.shape)}, expected input_size = "
                             f"{params[0].shape[1]} features")
        return empty_results(x, states, params,
                             states[0].shape[-1] * (2 if stand.bidirectional else 1))
    lens = None if lengths is None else lengths.cpu().numpy().astype("int64")
    draws = stand.training_dropout is not None
    if not draws and not records_gradients(x, *states, *sides, *params):
        layer = _inference_programs.get(stand, stand.names, params, stand.build(_rnnc.Layer))
        y, finals = _infer(layer, x, stand.state_names, states, lens,
                           dict(zip(stand.side_names, sides)))
        return [y, *finals]
    # In training with dropout, each call's masks from its own seed (torch's generator's, as the
    # module's eager call draws it), under no_grad too; a program that draws a weight's mask
    # when built is built for each seed.
    dropout, seed = stand.training_dropout or 0.0, stand.seed
    if seed is None:
        seed = int(torch.randint(0, 2**62, ())) if draws else 0
    program = _training_programs.get(
        stand, stand.names, params,
        stand.build(_rnnc.Training, dropout, seed, training=draws),
        key=(draws, dropout, seed if stand.masks_at_build else None))
    if program.draws_masks_at_build:
        stand.masks_at_build = True
    sizes = None  # a custom cell's sizes, for its forward in torch's operations
    if stand.cell not in TORCH_CELLS:
        sizes = dict(stand.sizes)
        if stand.input_size_name is not None:  # (a spec leaves it out: the layer's own)
            sizes[stand.input_size_name] = x.shape[-1]
    recompute = torch_recurrence(
        stand.cell, stand.num_layers, stand.bidirectional, stand.batch_first,
        any(name.startswith("bias") for name in stand.names), lens, sizes, stand.input_size_name,
        (seed, dropout) if draws else None)
    y, *finals = _Recurrence.apply(program, stand.state_names, stand.side_names, stand.names,
                                   None, recompute, x, lens, seed, *states, *sides, *params)
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


_ONNX_INT32 = 6  # TensorProto.INT32: the type of ONNX's sequence_lens


def _onnx_symbolic(g, spec_value, x, states, lengths, sides, params):
    """rnnc::forward in torch.onnx.export of a scripted or traced model: the graph torch's
    exporter gives for torch.nn's LSTM, GRU and RNN (their symbolic's own helper), with the
    layout from the spec; lengths are the operator's sequence_lens (int32), as torch's exporter
    gives a packed batch's. Other cells and side inputs have no ONNX operator."""
    from torch.onnx import symbolic_helper, symbolic_opset9

    parsed = json.loads(symbolic_helper._maybe_get_const(spec_value, "s"))
    variant = TORCH_CELLS.get(parsed["cell"])
    if variant is None or parsed["sides"]:
        named = re.search(r"\bcell\s+(\w+)", parsed["cell"])  # a cell's source, or its path
        what = (f"the cell {named.group(1) if named else parsed['cell']!r}" if variant is None else
                "side inputs")
        return symbolic_helper._unimplemented(
            "rnnc::forward", f"{what} in a traced or scripted model (ONNX's recurrent "
            "operators are LSTM, GRU and RNN; export the model itself, whose rnnc.nn.Recurrent "
            "then gives its cell's operations, unrolled over the example's steps)", x)
    # The states as a list written out (the scripted forwards write theirs so): a list a loop
    # built is an ONNX sequence, which the helper cannot read.
    if states.node().kind() != "prim::ListConstruct":
        return symbolic_helper._unimplemented(
            "rnnc::forward", "a scripted model (export the model itself, or its trace: "
            "torch.onnx.export(model, ...) with model a torch.nn.Module)", x)
    num_layers, bidirectional, batch_first = parsed["layout"]
    initial = symbolic_helper._unpack_list(states)
    sequence_lens = (None if symbolic_helper._is_none(lengths) else
                     g.op("Cast", lengths, to_i=_ONNX_INT32))
    outputs = symbolic_opset9._generic_rnn(
        g, variant, x, initial if variant == "LSTM" else initial[0],
        symbolic_helper._unpack_list(params), any(n.startswith("bias") for n in parsed["names"]),
        num_layers, 0.0, False, bidirectional, batch_first, batch_sizes=sequence_lens)
    return g.op("prim::ListConstruct", *outputs)


torch.onnx.register_custom_op_symbolic("rnnc::forward", _onnx_symbolic, 9)


def tracing():
    """Whether torch.jit.trace is recording this call."""
    return torch._C._get_tracing_state() is not None
