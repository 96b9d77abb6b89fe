"""rnnc.LSTMCell, GRUCell and RNNCell: torch.nn's one-step cells run by rnnc, for the loops that
call a cell once per step themselves (an autoregressive decoder feeding back its last output, a
sampler, a model with attention over its own states). The same constructor, state_dict names
(weight_ih, weight_hh, bias_ih, bias_hh), call and results as torch.nn's; the step is a
one-step run of the built-in cell's compiled layer, its weights packed once."""

import numpy as np

from ._recurrent import records_gradients
from .layers import (_as_array, _check_differentiable, _installed_torch, _is_torch, _like,
                     _result_type, _rnnc, _shape, _TorchWeights)


class _TorchCell(_TorchWeights):
    """torch.nn.LSTMCell, GRUCell and RNNCell. rnnc's own keyword options as rnnc.LSTM's:
    threads, jit, target_cpu, weights_dtype and device."""

    _gates = 1
    _mode = "RNN"

    def __init__(self, input_size, hidden_size, bias=True, *, threads=0, jit=True,
                 target_cpu="", weights_dtype="fp32", device="cpu"):
        for name, value in (("input_size", input_size), ("hidden_size", hidden_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
        self.input_size, self.hidden_size, self.bias = input_size, hidden_size, bool(bias)
        self._start(hidden_size, dict(threads=threads, jit=jit, target_cpu=target_cpu,
                                      weights_dtype=weights_dtype, device=device))

    def _shapes(self):
        gates = self._gates * self.hidden_size
        shapes = {"weight_ih": (gates, self.input_size), "weight_hh": (gates, self.hidden_size)}
        if self.bias:
            shapes.update(bias_ih=(gates,), bias_hh=(gates,))
        return shapes

    def _build(self):
        return _rnnc.Layer(self._cell_name(), self._weights, {}, 1, False, False,
                           self._options["jit"], self._options["threads"],
                           self._options["target_cpu"],
                           weights_dtype=self._options["weights_dtype"],
                           device=self._options["device"])

    def _states(self, hx):
        """hx as torch takes it, as (name, label, value): (h, c) for an LSTMCell, h otherwise."""
        if self._mode != "LSTM":
            return [("h", "hx", hx)]
        if not isinstance(hx, (tuple, list)) or len(hx) != 2:
            raise ValueError("LSTMCell expects hx as a tuple (h_0, c_0)")
        return [("h", "hx[0]", hx[0]), ("c", "hx[1]", hx[1])]

    def forward(self, input, hx=None):
        """One step: input [batch, input_size] or [input_size] (unbatched); hx (h, c) for an
        LSTMCell, h otherwise, each [batch, hidden_size] (or unbatched), zeros when None.
        Returns (h', c') for an LSTMCell, h' otherwise, shaped as the input's batch."""
        states = () if hx is None else tuple(value for _, _, value in self._states(hx))
        if (type(input) is not np.ndarray or hx is not None) and records_gradients(input,
                                                                                   *states):
            return self._differentiable_step(input, hx)
        as_torch = _is_torch(input)
        dtype = _result_type(input)
        x = _as_array(input, "input")
        if x.ndim not in (1, 2):
            raise ValueError(f"{type(self).__name__}: Expected input to be 1D or 2D, got "
                             f"{x.ndim}D input of shape {_shape(x)}")
        batched = x.ndim == 2
        if x.shape[-1] != self.input_size:
            raise ValueError(f"input has shape {_shape(x)}, expected "
                             f"{[x.shape[0], self.input_size] if batched else [self.input_size]}"
                             " ([batch, input_size] or [input_size])")
        batch = x.shape[0] if batched else 1
        expected = [batch, self.hidden_size] if batched else [self.hidden_size]
        given = {}
        for name, label, value in (self._states(hx) if hx is not None else ()):
            state = _as_array(value, label)
            if list(state.shape) != expected:
                raise ValueError(f"{label} has shape {_shape(state)}, expected {expected} "
                                 "(as the input's batch: [batch, hidden_size] or [hidden_size])")
            given[name] = state.reshape(1, batch, self.hidden_size)
        _, finals = self._layer().forward(x.reshape(1, batch, self.input_size), given, None, {})
        names = ("h", "c") if self._mode == "LSTM" else ("h",)
        results = [finals[name].reshape(expected) for name in names]
        if as_torch or dtype is not None:
            results = [_like(r, as_torch, dtype) for r in results]
        return tuple(results) if self._mode == "LSTM" else results[0]

    def _differentiable_step(self, input, hx):
        """The step where autograd records it: rnnc.nn's cell of these weights (rnnc's training
        forward and derived backward, its program kept while the weights stay), so the input
        and the states get torch's gradients (the weights are not torch parameters here)."""
        import torch

        _check_differentiable(f"rnnc.{type(self).__name__}", self._options["weights_dtype"],
                              self._options["device"])
        module = self._differentiable.get(self._build_differentiable)
        if hx is not None:  # rnnc.nn's cell takes torch tensors only
            hx = (tuple(torch.as_tensor(h) for h in hx) if isinstance(hx, (tuple, list))
                  else torch.as_tensor(hx))
        return module(torch.as_tensor(input), hx)

    def _build_differentiable(self):
        import torch

        from . import nn

        options = dict(bias=self.bias, threads=self._options["threads"],
                       jit=self._options["jit"], target_cpu=self._options["target_cpu"])
        if self._mode == "RNN":
            options["nonlinearity"] = self.nonlinearity
        module = getattr(nn, type(self).__name__)(self.input_size, self.hidden_size, **options)
        module.load_state_dict({name: torch.from_numpy(value)
                                for name, value in self._weights.items()})
        module.requires_grad_(False)
        return module.eval()

    def __repr__(self):
        extra = "" if self.bias else ", bias=False"
        if self._mode == "RNN" and self.nonlinearity != "tanh":
            extra += f", nonlinearity={self.nonlinearity!r}"
        return f"rnnc.{type(self).__name__}({self.input_size}, {self.hidden_size}{extra})"


class LSTMCell(_TorchCell):
    """torch.nn.LSTMCell, run by rnnc: ``h_1, c_1 = cell(x, (h_0, c_0))``."""

    _gates = 4
    _mode = "LSTM"


class GRUCell(_TorchCell):
    """torch.nn.GRUCell, run by rnnc: ``h_1 = cell(x, h_0)``."""

    _gates = 3
    _mode = "GRU"


class RNNCell(_TorchCell):
    """torch.nn.RNNCell (tanh or relu), run by rnnc: ``h_1 = cell(x, h_0)``."""

    def __init__(self, input_size, hidden_size, bias=True, nonlinearity="tanh", **options):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"Unknown nonlinearity: {nonlinearity}")
        self.nonlinearity = nonlinearity
        super().__init__(input_size, hidden_size, bias, **options)


def cell_from_torch(module, **options):
    """The rnnc equivalent of a torch.nn.LSTMCell, GRUCell or RNNCell (see rnnc.from_torch)."""
    torch = _installed_torch()
    kinds = {torch.nn.LSTMCell: LSTMCell, torch.nn.GRUCell: GRUCell, torch.nn.RNNCell: RNNCell}
    kind = next(ours for theirs, ours in kinds.items() if isinstance(module, theirs))
    if kind is RNNCell:
        options["nonlinearity"] = module.nonlinearity
    ours = kind(module.input_size, module.hidden_size, bias=module.bias, **options)
    ours.load_state_dict(module.state_dict())
    ours.train(module.training)
    return ours
