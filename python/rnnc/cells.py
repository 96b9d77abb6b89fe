"""rnnc.LSTMCell, GRUCell and RNNCell: torch.nn's one-step cells run by rnnc, for the loops that
call a cell once per step themselves (an autoregressive decoder feeding back its last output, a
sampler, a model with attention over its own states). The same constructor, state_dict names
(weight_ih, weight_hh, bias_ih, bias_hh), call and results as torch.nn's; the step is a
one-step run of the built-in cell's compiled layer, its weights packed once."""

import numpy as np

from ._recurrent import (CELL_STATE_LAYOUT, cell_step, check_state_shape, given_states,
                         records_gradients, refuse_tracing)
from .layers import _as_array, _installed_torch, _is_torch, _like, _result_type, _TorchWeights


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

    def forward(self, input, hx=None):
        """One step: input [batch, input_size] or [input_size] (unbatched); hx (h, c) for an
        LSTMCell, h otherwise, each [batch, hidden_size] (or unbatched), zeros when None.
        Returns (h', c') for an LSTMCell, h' otherwise, shaped as the input's batch."""
        if type(input) is not np.ndarray:
            refuse_tracing(f"rnnc.{type(self).__name__}", f"rnnc.nn.{type(self).__name__}")
        lstm = self._mode == "LSTM"
        given = [] if hx is None else given_states(lstm, hx, cell=True)
        if (type(input) is not np.ndarray or given) and records_gradients(
                input, *(value for _, _, value in given)):
            import torch

            return self._differentiable_forward(torch.as_tensor(input), hx)
        as_torch = _is_torch(input)
        dtype = _result_type(input)
        x = _as_array(input, "input")
        _, batch, expected = cell_step(self, x.shape)
        states = {}
        for name, label, value in given:
            state = _as_array(value, label)
            check_state_shape(label, state.shape, expected, CELL_STATE_LAYOUT)
            states[name] = state.reshape(1, batch, self.hidden_size)
        _, finals = self._layer().forward(x.reshape(1, batch, self.input_size), states, None, {})
        results = [finals[name].reshape(expected) for name in (("h", "c") if lstm else ("h",))]
        if as_torch or dtype is not None:
            results = [_like(r, as_torch, dtype) for r in results]
        return tuple(results) if lstm else results[0]

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
