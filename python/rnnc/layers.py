"""The Python half of rnnc's module: torch-shaped modules over the compiled layer programs.

Everything here converts and checks arguments the way torch.nn does; building, size inference,
running and the shape checks of the runtime are rnnc's C++ (``_rnnc``). A module compiles once,
on its first call after its weights are set (and comes from rnnc's disk cache in later
processes); calls may come from many threads at once, and each releases the GIL while it runs.
"""

import math
import os
import sys
import threading

import numpy as np

from . import _rnnc
from ._recurrent import (check_state_shape, given_states, ir_cell, records_gradients,
                         refuse_tracing, state_shapes)

# torch is imported only where it is needed (importing it takes over a second, most of `import
# rnnc`): an argument can only be a torch tensor or PackedSequence once the program has imported
# torch, so the checks look in sys.modules; results are torch tensors where the argument was one.


def _is_torch(x):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _packed_sequences():
    """torch's PackedSequence module, if the program has imported it."""
    return sys.modules.get("torch.nn.utils.rnn")


def _check_differentiable(what, weights_dtype, device):
    """Gradients run on the CPU in fp32, or in mixed precision with bf16 or fp16 weights (the
    backward rnnc derives); say so rather than cut the graph or give gradients of other weights
    than the forward used."""
    if weights_dtype == "int8" or device != "cpu":
        raise NotImplementedError(
            f"{what} with weights_dtype={weights_dtype!r}, device={device!r} runs inference only, "
            "and a tensor it was given requires grad: gradients need weights_dtype 'fp32', "
            "'bf16' or 'fp16' on the cpu; for inference, call it under torch.no_grad() (or pass "
            "tensors that do not require grad)")


def _installed_torch():
    """torch where it is installed (state_dict gives torch tensors then, as torch.nn's does)."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def _as_array(x, name):
    """x as float32 numpy in C order: a view of a contiguous float32 CPU tensor or array, a
    converted copy of any other floating-point one; anything else is rejected by name."""
    if _is_torch(x):
        import torch

        if x.dtype is torch.float32 and not x.requires_grad and x.is_contiguous():
            try:  # the common case, a view: as cheap as a call gets
                return x.numpy()
            except (TypeError, RuntimeError):  # not on the CPU, or otherwise unusual: below
                pass
        if x.device.type != "cpu":
            raise ValueError(f"{name} is on {x.device}; rnnc runs on the CPU: pass {name}.cpu()")
        if not x.is_floating_point():
            raise TypeError(f"{name} has dtype {x.dtype}; rnnc takes floating-point tensors "
                            "(float32, or others converted to float32)")
        x = x.detach()
        if x.dtype != torch.float32:
            x = x.float()
        return x.contiguous().numpy()
    a = np.asarray(x)
    if not np.issubdtype(a.dtype, np.floating):
        raise TypeError(f"{name} has dtype {a.dtype}; rnnc takes floating-point arrays "
                        "(float32, or others converted to float32)")
    return np.ascontiguousarray(a, dtype=np.float32)


def _lengths_array(lengths):
    a = lengths.cpu().numpy() if _is_torch(lengths) else np.asarray(lengths)
    if not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"lengths has dtype {a.dtype}; expected integers")
    return np.ascontiguousarray(a, dtype=np.int64)


def _like(array, as_torch, dtype=None):
    """A float32 result as the caller gave its input: a torch tensor or a numpy array, in
    `dtype` where that is the input's other floating type (_result_type), as torch.nn's modules
    answer a float64 or bfloat16 input."""
    if not as_torch:
        return array if dtype is None else array.astype(dtype)
    import torch

    tensor = torch.from_numpy(array)
    return tensor if dtype is None else tensor.to(dtype)


def _result_type(x):
    """The type a call's results come back in where it is not float32: x's floating type, torch's
    or numpy's; None for float32 and for what is not floating (rejected later). Cheap for
    float32, the common case: a call at T=1 B=1 H=64 takes 10-15 us in all."""
    if type(x) is np.ndarray:
        dtype = x.dtype
    elif _is_torch(x):
        dtype = x.dtype
        return None if dtype is sys.modules["torch"].float32 or not dtype.is_floating_point \
            else dtype
    else:
        dtype = np.asarray(x).dtype
    return None if dtype.kind != "f" or dtype == np.float32 else dtype


def _shape(x):
    return list(x.shape)


class _Program:
    """A compiled layer program, built on first use and again after the weights change."""

    def __init__(self):
        self._lock = threading.Lock()
        self._layer = None

    def get(self, build):
        layer = self._layer  # built already: no lock (reading one attribute is atomic)
        if layer is not None:
            return layer
        with self._lock:
            if self._layer is None:
                self._layer = build()
            return self._layer

    def reset(self):
        with self._lock:
            self._layer = None

    # A copy of a module (copy.deepcopy, pickle, torch.save of a model holding one) does not copy
    # the compiled program, which lives in rnnc's C++ and holds no Python state: the copy builds
    # its own on first use, from the disk cache.
    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self.__init__()


class Layer:
    """Any cell as a layer: ``cell`` is a built-in name (``rnnc.builtin_cells()``), the path of a
    ``.cell`` file or the cell's source text. Sizes the weights do not show are keyword
    arguments (``Layer(src, attention_size=32)``); num_layers and bidirectional are checked
    against the weights, or inferred from them when None. ``weights_dtype="fp16"`` stores the
    weights of every matrix product in half the bytes (the math stays fp32); ``"bf16"`` too, and
    its products multiply bf16-rounded inputs (summed in fp32; on AMX tiles where the CPU has
    them, vdpbf16ps on AMD's AVX512_BF16);
    ``"int8"`` quantizes dynamically.

        layer = rnnc.Layer("gru", input_size=8, hidden_size=16)
        layer.load_state_dict(torch.nn.GRU(8, 16).state_dict())
        y, final = layer(x, {"h": h0})       # final: {"h": h_n}
    """

    def __init__(self, cell, input_size=None, hidden_size=None, num_layers=None,
                 bidirectional=None, batch_first=False, *, threads=0, jit=True, target_cpu="",
                 weights_dtype="fp32", device="cpu", **sizes):
        self.cell = os.fspath(cell)
        self.sizes = {name: int(value) for name, value in sizes.items()}
        if input_size is not None:
            self.sizes["input_size"] = int(input_size)
        if hidden_size is not None:
            self.sizes["hidden_size"] = int(hidden_size)
        self.num_layers = num_layers
        self.bidirectional = bidirectional
        self.batch_first = bool(batch_first)
        self.threads = int(threads)
        self.jit = bool(jit)
        self.target_cpu = target_cpu
        self.weights_dtype = weights_dtype
        self.device = device
        self._weights = None
        self._program = _Program()
        self._training_program = _Program()  # for calls whose tensors require grad

    def load_state_dict(self, state_dict):
        """Weights under the cell's parameter names (PyTorch's for the built-in cells: weight_ih_l0,
        bias_hh_l1_reverse, ...), as torch tensors or numpy arrays."""
        self._weights = {name: _as_array(value, f"state_dict['{name}']")
                         for name, value in state_dict.items()}
        self._program.reset()
        self._training_program.reset()

    def state_dict(self):
        if self._weights is None:
            return {}
        as_torch = _installed_torch() is not None
        return {name: _like(value.copy(), as_torch) for name, value in self._weights.items()}

    def _layer(self):
        if self._weights is None:
            raise ValueError(f"{self._describe()} has no weights: call load_state_dict first")
        return self._program.get(self._build)

    def _build(self):
        # input_size is the first layer's (the others read the layer below), so it is checked
        # here rather than bound in every layer.
        sizes = {name: value for name, value in self.sizes.items() if name != "input_size"}
        layer = _rnnc.Layer(self.cell, self._weights, sizes, self.num_layers, self.bidirectional,
                            self.batch_first, self.jit, self.threads, self.target_cpu,
                            weights_dtype=self.weights_dtype, device=self.device)
        given = self.sizes.get("input_size")
        if given is not None and given != layer.input_size:
            raise ValueError(f"input_size={given} is given, but the weights' first layer reads "
                             f"{layer.input_size} input features")
        return layer

    def _describe(self):
        return f"rnnc.Layer({self.cell!r})" if "{" not in self.cell else "rnnc.Layer(<cell source>)"

    def __call__(self, input, states=None, lengths=None, **side_inputs):
        """``y, final = layer(x, {"h": h0, ...})``: x [T, B, I] ([B, T, I] with batch_first),
        each state [num_layers * num_directions, B, F] (absent ones start at zero), lengths [B]
        (each sequence's own length; outputs past it are zero). Side inputs of a cell with
        several inputs by name, laid out as x. Returns the output and every final state by name."""
        if type(input) is not np.ndarray:
            refuse_tracing("rnnc.Layer", "rnnc.nn.Recurrent")
        if records_gradients(input, *(states or {}).values(), *side_inputs.values()):
            return self._differentiable_call(input, states or {}, lengths, side_inputs)
        as_torch = _is_torch(input)
        dtype = _result_type(input)
        x = _as_array(input, "input")
        given = {name: _as_array(value, f"states['{name}']")
                 for name, value in (states or {}).items()}
        sides = {name: _as_array(value, name) for name, value in side_inputs.items()}
        lens = None if lengths is None else _lengths_array(lengths)
        y, finals = self._layer().forward(x, given, lens, sides)
        return (_like(y, as_torch, dtype),
                {name: _like(v, as_torch, dtype) for name, v in finals.items()})

    forward = __call__

    def _differentiable_call(self, input, states, lengths, side_inputs):
        """The call when autograd records it: rnnc's training forward (in eval mode: dropouts are
        the identity, as in inference) as a torch.autograd.Function, whose backward gives the
        gradients of the input, the initial states and the side inputs (the weights are not
        torch parameters here; rnnc.nn.Recurrent trains them)."""
        import torch

        from ._autograd import _in_type, _Recurrence

        _check_differentiable(self._describe(), self.weights_dtype, self.device)
        if not _is_torch(input):
            raise TypeError(f"{self._describe()}: a state or side input requires grad, so the "
                            f"input must be a torch tensor too, not {type(input).__name__}")
        names = self.state_names
        unknown = sorted(set(states) - set(names))
        if unknown:
            raise ValueError(f"the cell has no state {', '.join(unknown)}; its states: "
                             f"{', '.join(names)}")
        program = self._training_program.get(self._build_training)
        x = input.float()
        initial = []
        for name in names:
            state = states.get(name)
            initial.append(None if state is None else torch.as_tensor(state).float())
        sides = {name: torch.as_tensor(value).float() for name, value in side_inputs.items()}
        lens = None if lengths is None else _lengths_array(lengths)
        y, *finals = _Recurrence.apply(program, names, list(sides), [], None,
                                       self._torch_form(lens), x, lens, None, *initial,
                                       *sides.values())
        y, finals = _in_type(input.dtype, y, finals)
        return y, dict(zip(names, finals))

    def _torch_form(self, lengths):
        """The layer's forward in torch's operations, for a second derivative (_autograd.
        torch_recurrence's, for the call's lengths), its weights constants: f(x, initial, sides,
        params, products) ignoring `params` (the weights are not torch parameters here)."""
        layer, weights = self._layer(), self._weights

        def forward(x, initial, sides, params, products="fp32"):  # (read when first needed)
            import torch

            from ._autograd import TORCH_RECURRENCES, torch_recurrence
            from ._torch_cell import TorchCell

            layout = (layer.num_layers, layer.num_directions == 2, self.batch_first)
            sizes = layer.sizes
            slots = [f"_l{k}{suffix}" for k in range(layout[0])
                     for suffix in ([""] if not layout[1] else ["", "_reverse"])]
            if self.cell in TORCH_RECURRENCES:  # torch.nn's names and order
                kinds = ["weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr"]
                names = [kind + slot for slot in slots for kind in kinds if kind + slot in weights]
                form = torch_recurrence(self.cell, *layout, "bias_ih_l0" in weights, lengths)
            else:  # the cell's parameters in its order, per layer and direction
                input_size = _rnnc.cell_signature(self.cell, sizes)["input_size"]
                params = TorchCell(_rnnc.parsed_cell_ir(self.cell, sizes)).params
                names = [param + slot for slot in slots for param in params]
                form = torch_recurrence(self.cell, *layout, True, lengths, sizes, input_size)
            return form(x, initial, sides, [torch.from_numpy(weights[n]) for n in names],
                        products)

        return forward

    def _build_training(self):
        self._layer()  # the same checks and sizes as inference
        sizes = {name: value for name, value in self.sizes.items() if name != "input_size"}
        return _rnnc.Training(self.cell, self._weights, sizes, self.num_layers,
                              self.bidirectional, self.batch_first, self.jit, self.threads,
                              self.target_cpu, 0.0, 0, training=False,
                              weights_dtype=self.weights_dtype)

    def ir(self, after=None, grad=False):
        """The cell's IR through rnnc's passes: after every pass (``after="all"``, each headed by
        its pass), after one pass by name, or the optimised IR (None). With weights loaded, the
        sizes are theirs; otherwise the sizes given to the constructor. ``grad=True``: the
        backward step rnnc derives for training instead (one step of backpropagation through
        time, as ``rnnc compile CELL --train --grad``), with the constructor's sizes."""
        if grad or self._weights is None:
            return _rnnc.cell_ir(self.cell, self.sizes, after, grad)
        return self._layer().ir(after)

    @property
    def state_names(self):
        return self._layer().state_names


class _TorchWeights:
    """What torch.nn's recurrent modules and cells run by rnnc share: weights under torch's
    state_dict names (numpy float32, initialised as torch does), their loading and checking, the
    training flag, and the compiled programs built from them (inference, and rnnc.nn's module
    for calls that autograd records). A subclass gives _shapes() and _cell_name()."""

    def _start(self, hidden_size, options):
        self.training = True
        self._options = options
        self._program = _Program()
        self._differentiable = _Program()  # rnnc.nn's module, for calls that require grad
        # torch.nn's initialisation: every weight and bias uniform in [-1/sqrt(H), 1/sqrt(H)].
        bound = 1.0 / math.sqrt(hidden_size)
        rng = np.random.default_rng()
        self._weights = {name: rng.uniform(-bound, bound, shape).astype(np.float32)
                         for name, shape in self._shapes().items()}

    def _cell_name(self):
        if self._mode == "RNN":
            return "rnn_tanh" if self.nonlinearity == "tanh" else "rnn_relu"
        return {"LSTM": "lstm", "GRU": "gru"}[self._mode]

    def train(self, mode=True):
        self.training = bool(mode)
        return self

    def eval(self):
        return self.train(False)

    def load_state_dict(self, state_dict, strict=True):
        """A torch module's state_dict (torch tensors or numpy arrays); every name must be one this
        module has, with its shape, and (strict) every one of them given."""
        shapes = self._shapes()
        unexpected = sorted(set(state_dict) - set(shapes))
        missing = sorted(set(shapes) - set(state_dict))
        if unexpected or (strict and missing):
            raise KeyError(f"Error(s) in loading state_dict for {type(self).__name__}: "
                           f"missing keys {missing}, unexpected keys {unexpected}")
        weights = dict(self._weights)
        for name, value in state_dict.items():
            array = _as_array(value, f"state_dict['{name}']")
            if tuple(array.shape) != shapes[name]:
                raise ValueError(f"state_dict['{name}'] has shape {_shape(array)}, expected "
                                 f"{list(shapes[name])}")
            weights[name] = array
        self._weights = weights
        self._program.reset()
        self._differentiable.reset()

    def state_dict(self):
        as_torch = _installed_torch() is not None
        return {name: _like(self._weights[name].copy(), as_torch) for name in self._shapes()}

    def _layer(self):
        return self._program.get(self._build)

    def _layout(self):
        """(num_layers, bidirectional, batch_first): a cell's, one step of one layer."""
        return 1, False, False

    def _build(self):
        return _rnnc.Layer(self._cell_name(), self._weights, {}, *self._layout(),
                           self._options["jit"], self._options["threads"],
                           self._options["target_cpu"],
                           weights_dtype=self._options["weights_dtype"],
                           device=self._options["device"])

    def _torch_options(self):
        """rnnc.nn's module's constructor options, as this module's."""
        options = dict(bias=self.bias, threads=self._options["threads"],
                       jit=self._options["jit"], target_cpu=self._options["target_cpu"],
                       weights_dtype=self._options["weights_dtype"])
        if self._mode == "RNN":
            options["nonlinearity"] = self.nonlinearity
        return options

    def _differentiable_forward(self, input, hx):
        """A call autograd records: rnnc.nn's module of this one's kind, options and weights, in
        eval mode and with its parameters frozen (_build_differentiable), so that autograd
        reaches the input and hx through rnnc's backward (the weights are not torch parameters
        here)."""
        import torch

        _check_differentiable(f"rnnc.{type(self).__name__}", self._options["weights_dtype"],
                              self._options["device"])
        if hx is not None:  # rnnc.nn's modules take torch tensors only
            hx = (tuple(torch.as_tensor(h) for h in hx) if isinstance(hx, (tuple, list))
                  else torch.as_tensor(hx))
        return self._differentiable.get(self._build_differentiable)(input, hx)

    def _build_differentiable(self):
        import torch

        from . import nn

        module = getattr(nn, type(self).__name__)(self.input_size, self.hidden_size,
                                                  **self._torch_options())
        module.load_state_dict({name: torch.from_numpy(value)
                                for name, value in self._weights.items()})
        module.requires_grad_(False)
        return module.eval()

    def ir(self, after=None, grad=False):
        """The cell's IR after rnnc's passes, with this module's sizes (see Layer.ir; grad=True:
        the backward step of training)."""
        if grad:
            return _rnnc.cell_ir(*ir_cell(self._cell_name(), self), after, True)
        return self._layer().ir(after)

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)


class _TorchRNN(_TorchWeights):
    """torch.nn.LSTM, GRU and RNN: the same constructor, state_dict names, call and results. Not
    a torch.nn.Module (rnnc imports without torch): inside a torch model, whose state_dict and
    .eval() should reach it, use rnnc.nn's module of the same name.
    rnnc's own keyword options: threads, jit, target_cpu, weights_dtype ("fp32"; "fp16": the
    weights of every matrix product in half the bytes, the math in fp32; "bf16": bf16 products
    summed in fp32; "int8": dynamic quantization) and device
    ("cpu", "cuda": the GPU's kernels through the CUDA driver, "cuda-emulated": those kernels run
    on this CPU)."""

    _gates = 1
    _mode = "RNN"

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, proj_size=0, *, threads=0, jit=True,
                 target_cpu="", weights_dtype="fp32", device="cpu"):
        if not isinstance(hidden_size, int) or hidden_size <= 0:
            raise ValueError(f"hidden_size must be a positive integer, not {hidden_size!r}")
        if not isinstance(num_layers, int) or num_layers <= 0:
            raise ValueError(f"num_layers must be a positive integer, not {num_layers!r}")
        if not isinstance(dropout, (int, float)) or not 0 <= dropout <= 1 or isinstance(dropout, bool):
            raise ValueError("dropout should be a number in range [0, 1] representing the "
                             f"probability of an element being zeroed, not {dropout!r}")
        if proj_size < 0:
            raise ValueError("proj_size should be a positive integer or zero to disable projections")
        if proj_size and self._mode != "LSTM":
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        if proj_size >= hidden_size:
            raise ValueError("proj_size has to be smaller than hidden_size")
        self.input_size = int(input_size)
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bool(bias)
        self.batch_first = bool(batch_first)
        self.dropout = float(dropout)
        self.bidirectional = bool(bidirectional)
        self.proj_size = int(proj_size)
        self._start(hidden_size, dict(threads=threads, jit=jit, target_cpu=target_cpu,
                                      weights_dtype=weights_dtype, device=device))

    def _shapes(self):
        """Every parameter's name and shape, in torch's order."""
        shapes = {}
        directions = 2 if self.bidirectional else 1
        real_hidden = self.proj_size or self.hidden_size
        gates = self._gates * self.hidden_size
        for layer in range(self.num_layers):
            layer_input = self.input_size if layer == 0 else real_hidden * directions
            for suffix in [""] + (["_reverse"] if self.bidirectional else []):
                s = f"_l{layer}{suffix}"
                shapes["weight_ih" + s] = (gates, layer_input)
                shapes["weight_hh" + s] = (gates, real_hidden)
                if self.bias:
                    shapes["bias_ih" + s] = (gates,)
                    shapes["bias_hh" + s] = (gates,)
                if self.proj_size:
                    shapes["weight_hr" + s] = (self.proj_size, self.hidden_size)
        return shapes

    def _layout(self):
        return self.num_layers, self.bidirectional, self.batch_first

    def _torch_options(self):
        options = dict(super()._torch_options(), num_layers=self.num_layers,
                       batch_first=self.batch_first, dropout=self.dropout,
                       bidirectional=self.bidirectional)
        if self._mode == "LSTM":
            options["proj_size"] = self.proj_size
        return options

    def forward(self, input, hx=None):
        if self.training and self.dropout > 0 and self.num_layers > 1:
            raise NotImplementedError(
                f"{type(self).__name__}(dropout={self.dropout}) in training mode: rnnc."
                f"{type(self).__name__} runs inference, where dropout between layers is the "
                f"identity; call .eval() first, or train with rnnc.nn.{type(self).__name__} (a "
                "torch.nn.Module whose forward and backward are rnnc's, dropout included)")
        if type(input) is not np.ndarray:
            refuse_tracing(f"rnnc.{type(self).__name__}", f"rnnc.nn.{type(self).__name__}")
        # (numpy input without hx, the cheapest call, needs no look: nothing can require grad)
        if (type(input) is not np.ndarray or hx is not None) and records_gradients(
                input, *(hx if isinstance(hx, (tuple, list)) else (hx,))):
            return self._differentiable_forward(input, hx)
        rnn_utils = _packed_sequences()
        packed = rnn_utils is not None and isinstance(input, rnn_utils.PackedSequence)
        lengths = None
        if packed:
            padded, lengths = rnn_utils.pad_packed_sequence(input, batch_first=self.batch_first)
            sequence = padded
        else:
            sequence = input
        as_torch = _is_torch(sequence)
        dtype = _result_type(sequence)
        x = _as_array(sequence, "input")
        batched = x.ndim == 3
        if x.ndim == 2 and not packed:  # unbatched, as torch.nn allows: [T, I]
            x = np.ascontiguousarray(x[:, None, :] if not self.batch_first else x[None, :, :])
        elif x.ndim != 3:
            raise ValueError(f"{type(self).__name__}: Expected input to be 2D or 3D, got {x.ndim}D "
                             f"input of shape {_shape(x)}")
        batch = x.shape[0] if self.batch_first else x.shape[1]
        states = self._initial_states(hx, batch, batched) if hx is not None else {}
        lens = None if lengths is None else _lengths_array(lengths)
        y, finals = self._layer().forward(x, states, lens, {})
        results = [y, finals["h"]] + ([finals["c"]] if self._mode == "LSTM" else [])
        if not batched:
            results[0] = y[0] if self.batch_first else y[:, 0]
            results[1:] = [np.ascontiguousarray(f[:, 0]) for f in results[1:]]
            results[0] = np.ascontiguousarray(results[0])
        if as_torch or dtype is not None:
            results = [_like(r, as_torch, dtype) for r in results]
        if packed:
            from ._packed import repack  # (torch is imported: the input is its PackedSequence)
            results[0] = repack(results[0], input, self.batch_first)
        if self._mode == "LSTM":
            return results[0], (results[1], results[2])
        return results[0], results[1]

    def _initial_states(self, hx, batch, batched):
        expected = state_shapes(self, self._mode == "LSTM", batch)
        states = {}
        for name, label, value in given_states(self._mode == "LSTM", hx):
            array = _as_array(value, label)
            if not batched and array.ndim == 2:
                array = array[:, None, :]
            check_state_shape(label, array.shape, expected[name])
            states[name] = np.ascontiguousarray(array)
        return states

    def __repr__(self):
        args = [str(self.input_size), str(self.hidden_size)]
        for name, default in [("num_layers", 1), ("bias", True), ("batch_first", False),
                              ("dropout", 0.0), ("bidirectional", False), ("proj_size", 0)]:
            if getattr(self, name) != default:
                args.append(f"{name}={getattr(self, name)}")
        return f"rnnc.{type(self).__name__}({', '.join(args)})"


class LSTM(_TorchRNN):
    """torch.nn.LSTM, run by rnnc: ``y, (h_n, c_n) = lstm(x, (h_0, c_0))``."""

    _gates = 4
    _mode = "LSTM"


class GRU(_TorchRNN):
    """torch.nn.GRU, run by rnnc: ``y, h_n = gru(x, h_0)``."""

    _gates = 3
    _mode = "GRU"

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
                 dropout=0.0, bidirectional=False, **options):
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, **options)


class RNN(_TorchRNN):
    """torch.nn.RNN (tanh or relu), run by rnnc: ``y, h_n = rnn(x, h_0)``."""

    _gates = 1
    _mode = "RNN"

    def __init__(self, input_size, hidden_size, num_layers=1, nonlinearity="tanh", bias=True,
                 batch_first=False, dropout=0.0, bidirectional=False, **options):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or 'relu'.")
        self.nonlinearity = nonlinearity
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, **options)


def from_torch(module, **options):
    """The rnnc equivalent of a torch.nn.LSTM, GRU or RNN (or LSTMCell, GRUCell, RNNCell): same
    options, its weights, its training flag. ``options``: threads, jit, target_cpu,
    weights_dtype, device."""
    torch = _installed_torch()
    if torch is None:
        raise ImportError("rnnc.from_torch needs torch")
    if isinstance(module, (torch.nn.LSTMCell, torch.nn.GRUCell, torch.nn.RNNCell)):
        from .cells import cell_from_torch

        return cell_from_torch(module, **options)
    if not isinstance(module, (torch.nn.LSTM, torch.nn.GRU, torch.nn.RNN)):
        raise TypeError(f"rnnc.from_torch takes a torch.nn.LSTM, GRU or RNN (or LSTMCell, "
                        f"GRUCell, RNNCell), not {type(module).__name__}")
    common = dict(num_layers=module.num_layers, bias=module.bias, batch_first=module.batch_first,
                  dropout=module.dropout, bidirectional=module.bidirectional, **options)
    if isinstance(module, torch.nn.LSTM):
        ours = LSTM(module.input_size, module.hidden_size, proj_size=module.proj_size, **common)
    elif isinstance(module, torch.nn.GRU):
        ours = GRU(module.input_size, module.hidden_size, **common)
    else:
        ours = RNN(module.input_size, module.hidden_size, nonlinearity=module.nonlinearity,
                   **common)
    ours.load_state_dict(module.state_dict())
    ours.train(module.training)
    return ours
