"""rnnc.nn: torch.nn.LSTM, GRU and RNN whose forward and backward are rnnc's.

Each is the torch.nn module itself (same constructor, parameters, initialisation, state_dict and
optimiser use) with its forward run by rnnc: a torch.autograd.Function whose forward is rnnc's
training forward (it keeps what the backward reads) and whose backward is the backward rnnc
derives from the cell (passes/Autodiff), so ``loss.backward()`` fills every parameter's
``.grad``, the input's and the initial states'. Dropout between layers in training mode is
rnnc's own (new masks each call, from torch's random generator).

    lstm = rnnc.nn.LSTM(512, 512, num_layers=2)
    y, (h_n, c_n) = lstm(x)
    y.sum().backward()
"""

import torch
from torch.nn.utils.rnn import PackedSequence, pad_packed_sequence

from . import _rnnc
from ._recurrent import check_state_shape, given_states, repack, state_shapes

__all__ = ["LSTM", "GRU", "RNN"]


def _initial_name(state):
    """The name the runtime gives an initial state's gradient."""
    return state + "0" if state in ("h", "c") else state


class _Recurrence(torch.autograd.Function):
    """y and the final states from x, the initial states and the parameters, all float32."""

    @staticmethod
    def forward(ctx, program, state_names, param_names, x, lengths, *tensors):
        states = {name: t.detach().contiguous().numpy()
                  for name, t in zip(state_names, tensors[:len(state_names)])}
        y, finals, tape = program.forward(x.detach().contiguous().numpy(), states, lengths)
        ctx.program, ctx.tape = program, tape
        ctx.state_names, ctx.param_names = state_names, param_names
        return (torch.from_numpy(y),) + tuple(torch.from_numpy(finals[n]) for n in state_names)

    @staticmethod
    def backward(ctx, grad_y, *grad_finals):
        grads = ctx.program.backward(
            ctx.tape, grad_y.contiguous().numpy(),
            {name: g.contiguous().numpy() for name, g in zip(ctx.state_names, grad_finals)})
        dstates = [torch.from_numpy(grads[_initial_name(n)]) for n in ctx.state_names]
        dparams = [torch.from_numpy(grads[n]) if n in grads else None for n in ctx.param_names]
        return (None, None, None, torch.from_numpy(grads["input"]), None, *dstates, *dparams)


class _RnncForward:
    """The forward of torch.nn.RNNBase, run by rnnc (mixed into torch's own modules)."""

    def __init__(self, *args, threads=0, jit=True, target_cpu="", **kwargs):
        super().__init__(*args, **kwargs)
        self._rnnc_options = dict(jit=bool(jit), threads=int(threads), target_cpu=target_cpu)

    def _rnnc_cell(self):
        return {"LSTM": "lstm", "GRU": "gru", "RNN_TANH": "rnn_tanh",
                "RNN_RELU": "rnn_relu"}[self.mode]

    def _initial_states(self, hx, batch, batched, like):
        shapes = state_shapes(self, self.mode == "LSTM", batch)
        if hx is None:
            return [like.new_zeros(shape) for shape in shapes.values()]
        states = []
        for name, label, state in given_states(self.mode == "LSTM", hx):
            if not batched and state.dim() == 2:
                state = state.unsqueeze(1)
            check_state_shape(label, state.shape, shapes[name])
            states.append(state.float())
        return states

    def forward(self, input, hx=None):
        packed = isinstance(input, PackedSequence)
        lengths = None
        if packed:
            x, lengths = pad_packed_sequence(input, batch_first=self.batch_first)
            lengths = lengths.numpy()
        else:
            x = input
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(f"{type(self).__name__} takes a floating-point tensor, not "
                            f"{getattr(x, 'dtype', type(x).__name__)}")
        batched = x.dim() == 3
        if x.dim() == 2 and not packed:  # unbatched: [T, I]
            x = x.unsqueeze(0 if self.batch_first else 1)
        elif x.dim() != 3:
            raise ValueError(f"{type(self).__name__}: Expected input to be 2D or 3D, got "
                             f"{x.dim()}D input of shape {list(x.shape)}")
        x = x.float()
        batch = x.shape[0 if self.batch_first else 1]
        states = self._initial_states(hx, batch, batched, x)
        names = list(self._flat_weights_names)
        params = [p.float() for p in self._flat_weights]
        dropout = self.dropout if self.training and self.num_layers > 1 else 0.0
        seed = int(torch.randint(0, 2**62, ())) if dropout > 0 else 0
        program = _rnnc.Training(
            self._rnnc_cell(), {n: p.detach().contiguous().numpy() for n, p in zip(names, params)},
            {}, self.num_layers, self.bidirectional, self.batch_first, self._rnnc_options["jit"],
            self._rnnc_options["threads"], self._rnnc_options["target_cpu"], dropout, seed)
        state_names = list(state_shapes(self, self.mode == "LSTM", batch))
        y, *finals = _Recurrence.apply(program, state_names, names, x, lengths, *states, *params)
        if not batched:
            y = y.squeeze(0 if self.batch_first else 1)
            finals = [f.squeeze(1) for f in finals]
        if packed:
            y = repack(y, input, self.batch_first)
        if self.mode == "LSTM":
            return y, (finals[0], finals[1])
        return y, finals[0]


class LSTM(_RnncForward, torch.nn.LSTM):
    """torch.nn.LSTM trained through rnnc (options: threads, jit, target_cpu)."""


class GRU(_RnncForward, torch.nn.GRU):
    """torch.nn.GRU trained through rnnc."""


class RNN(_RnncForward, torch.nn.RNN):
    """torch.nn.RNN (tanh or relu) trained through rnnc."""
