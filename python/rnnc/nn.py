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

``rnnc.nn.LSTMCell``, ``GRUCell`` and ``RNNCell`` are torch.nn's one-step cells the same way,
for loops that step a cell themselves (a decoder trained on its own outputs).

``rnnc.nn.Recurrent`` is any cell (a ``.cell`` file, its source or a built-in name) as a
torch.nn.Module trained the same way, its parameters the cell's; in training mode the cell's
``dropout`` draws new masks each call, which its backward reuses.

    cell = rnnc.nn.Recurrent("mgu.cell", input_size=2, hidden_size=32)
    y, finals = cell(x)            # finals: {"h": h_n}

Every module takes rnnc's options as keywords: threads, jit, target_cpu and weights_dtype, which
may change between calls: a model trained in fp32 (or in mixed precision, with bf16 or fp16
weights, or under torch.autocast("cpu", torch.bfloat16), which runs fp32 modules as bf16 ones)
runs inference with int8, fp16 or bf16 weights after ``module.weights_dtype = "int8"`` (int8
under torch.no_grad() or torch.inference_mode()).
"""

import copy
import os
import sys
import warnings
from typing import Dict, List, Optional, Tuple

import torch
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence, pad_packed_sequence

from . import _rnnc, _torch_op
from ._autograd import (_in_type, _Recurrence, packed_recurrence, summed_parameters,
                        torch_recurrence)
from ._packed import repack
from ._programs import (_infer, _inference_programs, _program, _ProgramCache, _training_programs,
                        rnnc_options)
from ._recurrent import (CELL_STATE_LAYOUT, cell_step, check_state_shape, given_states, ir_cell,
                         records_gradients, state_shapes)

__all__ = ["LSTM", "GRU", "RNN", "LSTMCell", "GRUCell", "RNNCell", "Recurrent"]


def _token(summed):
    """The inputs a call adds for summed_parameters' result: its token, if any."""
    return [] if summed is None else [summed[1]]


def _empty_batch(module, x, states, params, width):
    """torch.nn's results for a batch of no sequences (_torch_op.empty_results), the input's
    width checked."""
    if x.shape[-1] != module.input_size:
        raise ValueError(f"input has shape {list(x.shape)}, expected input_size = "
                         f"{module.input_size} features")
    y, *finals = _torch_op.empty_results(x, states, params, width)
    return y, finals


class _WeightsDtype:
    """The weights_dtype option of rnnc's torch modules, which may change between calls (train in
    fp32, then ``module.weights_dtype = "int8"`` for inference): fp32; fp16 or bf16 (half the
    bytes), which also train (mixed precision: the products read the rounded weights, the
    parameters and gradients stay fp32; a second derivative replays the rounding); int8
    (dynamic quantization), inference only (under torch.no_grad() or torch.inference_mode()):
    a call that autograd records is refused."""

    # TorchScript compiles a module's properties unless told (torch.nn.RNNBase's own too).
    __jit_unused_properties__ = ["all_weights", "weights_dtype"]

    @property
    def weights_dtype(self):
        return self._rnnc_options.get("weights_dtype", "fp32")  # (the option, autocast aside)

    @weights_dtype.setter
    def weights_dtype(self, dtype):
        self._rnnc_options = rnnc_options(**dict(self._rnnc_options, weights_dtype=dtype))


class _RnncModule(_WeightsDtype):
    """What torch's modules run by rnnc add to them: rnnc's options (threads, jit, target_cpu,
    weights_dtype), pickling without the compiled programs (a copy builds its own) and the
    cell's IR."""

    def ir(self, after=None, grad=False):
        """The cell's IR through rnnc's passes, with this module's sizes: after every pass
        (``after="all"``), after one pass by name, or the optimised IR (None); ``grad=True``: the
        backward step rnnc derives for training."""
        return _rnnc.cell_ir(*ir_cell(self._rnnc_cell(), self), after, grad)

    def __getstate__(self):
        return _ProgramCache.without(super().__getstate__())

    def __init__(self, *args, threads=0, jit=True, target_cpu="", weights_dtype="fp32",
                 **kwargs):
        super().__init__(*args, **kwargs)
        self._rnnc_options = rnnc_options(jit, threads, target_cpu, weights_dtype)

    def _onnx_forward(self, *args):
        """The forward under torch.onnx.export: torch.nn's own (the module's class among its
        bases), which the exporter maps onto ONNX's LSTM, GRU and RNN operators, so the graph is
        the one torch.nn's module exports (rnnc::forward has no ONNX form)."""
        torch_type = next(base for base in type(self).__mro__
                          if base.__module__ == "torch.nn.modules.rnn")
        return torch_type.forward(self, *args)

    def __prepare_scriptable__(self):
        """torch.jit.script calls this on every module it compiles, first: the TorchScript
        forward reads the spec (rnnc::forward's) as an attribute, set here as the module is
        now."""
        self._rnnc_spec = self._spec()
        self._rnnc_training_spec = self._training_spec()
        return self

    def _training_spec(self):
        """The spec of a call in training mode (the one that draws dropout masks, if any)."""
        return self._rnnc_spec

    def _scripted_spec(self) -> str:
        """rnnc::forward's spec in TorchScript: in training mode, the one drawing the masks of
        the module's dropout (a seed per call, from torch's generator)."""
        if self.training:
            return self._rnnc_training_spec
        return self._rnnc_spec


def _scripted_alone():
    """Whether torch.jit.script was given the module calling __prepare_scriptable__ itself,
    rather than a model holding it: torch.jit.script calls call_prepare_scriptable_func(obj),
    whose _impl calls the hook and then itself on every submodule. (Were torch to rename these,
    this says False, and the module scripts as torch.nn's own.)"""
    caller = sys._getframe(2)  # 0: here; 1: __prepare_scriptable__; 2: the hook's caller
    above = caller.f_back
    return (caller.f_code.co_name == "call_prepare_scriptable_func_impl" and above is not None
            and above.f_code.co_name == "call_prepare_scriptable_func")


def _alone(module, padded_forward):
    """The copy of `module` that torch.jit.script compiles when given the module itself: its
    forward `padded_forward` (bound to the copy), the parameters shared. Not the overloads a
    scripting of a model holding the module wrote into it (``__overloads__``, which would make
    TorchScript skip the copy's forward as overloaded: no forward)."""
    alone = copy.copy(module)
    alone.__dict__.pop("__overloads__", None)
    alone.forward = padded_forward.__func__.__get__(alone)
    return alone


class _RnncForward(_RnncModule):
    """The forward of torch.nn.RNNBase, run by rnnc (mixed into torch's own modules)."""

    def __prepare_scriptable__(self):
        """A module scripted alone scripts a copy whose forward takes a padded tensor only:
        its forward is declared for a tensor and for a PackedSequence (as torch.nn's are, so
        that a model holding it calls it with either), and torch compiles such a forward only
        where a caller picks one, so that the scripted torch.nn.LSTM itself has no forward
        (pytorch/pytorch#32976). The copy shares the module's parameters."""
        module = super().__prepare_scriptable__()
        if not _scripted_alone():
            return module
        return _alone(module, module._padded_forward)

    def _rnnc_cell(self):
        return {"LSTM": "lstm", "GRU": "gru", "RNN_TANH": "rnn_tanh",
                "RNN_RELU": "rnn_relu"}[self.mode]

    def _spec(self, training_dropout=None):
        states = ["h", "c"] if self.mode == "LSTM" else ["h"]
        return _torch_op.spec(self._rnnc_cell(), {},
                              (self.num_layers, self.bidirectional, self.batch_first),
                              self._flat_weights_names, states, [], self._rnnc_options,
                              training_dropout=training_dropout)

    def _training_spec(self):
        return self._spec(self.dropout if self.dropout > 0 and self.num_layers > 1 else None)

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

    def _eager_forward(self, input, hx):
        if torch.onnx.is_in_onnx_export():
            return self._onnx_forward(input, hx)
        packed = isinstance(input, PackedSequence)
        lengths = traced_lengths = None
        if packed:
            x, traced_lengths = pad_packed_sequence(input, batch_first=self.batch_first)
            lengths = None if _torch_op.tracing() else traced_lengths.numpy()
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
        dtype = x.dtype  # rnnc computes in float32; the results come back in the input's type
        x = x.float()
        batch = x.shape[0 if self.batch_first else 1]
        states = self._initial_states(hx, batch, batched, x)
        names = list(self._flat_weights_names)
        # The parameters as attributes, not _flat_weights: torch.nn.utils.stateless's
        # functional_call (MAML's fast weights) replaces the attributes alone (torch 1.13's own
        # modules then run on the module's weights, silently).
        params = [getattr(self, name).float() for name in names]
        dropout = self.dropout if self.training and self.num_layers > 1 else 0.0
        state_names = list(state_shapes(self, self.mode == "LSTM", batch))
        if _torch_op.tracing():  # (in training with dropout: masks drawn at each call)
            y, *finals = torch.ops.rnnc.forward(self._spec(dropout if dropout > 0 else None), x,
                                                states, traced_lengths, [], params)
        elif batch == 0 and x.shape[1 if self.batch_first else 0] > 0:
            width = (self.proj_size or self.hidden_size) * (2 if self.bidirectional else 1)
            y, finals = _empty_batch(self, x, states, params, width)
        elif dropout == 0 and not records_gradients(x, *states, *params):
            layer = _inference_programs.get(self, names, params, lambda weights: _program(
                _rnnc.Layer, self, self._rnnc_cell(), dict(zip(names, weights)), {}))
            y, finals = _infer(layer, x, state_names, states, lengths)
        else:
            # The program is the same until the weights change (a loop calling the module several
            # times per optimiser step builds it once); each call draws its own masks.
            seed = int(torch.randint(0, 2**62, ())) if dropout > 0 else 0
            program = _training_programs.get(
                self, names, params, lambda weights: _program(
                    _rnnc.Training, self, self._rnnc_cell(), dict(zip(names, weights)), {},
                    dropout, seed, training=self.training), key=(self.training, dropout))
            summed = summed_parameters(self, names, params)
            recompute = torch_recurrence(
                self._rnnc_cell(), self.num_layers, self.bidirectional, self.batch_first,
                self.bias, lengths, drawn=(seed, dropout) if dropout > 0 else None)
            y, *finals = _Recurrence.apply(program, state_names, [], names, summed, recompute, x,
                                           lengths, seed, *_token(summed), *states, *params)
        y, finals = _in_type(dtype, y, finals)
        if not batched:
            y = y.squeeze(0 if self.batch_first else 1)
            finals = [f.squeeze(1) for f in finals]
        if packed:
            y = repack(y, input, self.batch_first)
        if self.mode == "LSTM":
            return y, (finals[0], finals[1])
        return y, finals[0]

    # The forward in TorchScript (torch.jit.script of a model holding the module): what
    # _eager_forward does for a padded or unbatched tensor (or a PackedSequence's padded tensor
    # and lengths), around rnnc::forward. The shapes are checked here: torch 1.13's TorchScript
    # interpreter drops the message of an exception raised in a Python kernel, such as
    # rnnc::forward's. The code is straight-line, states and results by name rather than in
    # loops, so that torch.onnx.export of a scripted model finds the operator's lists as
    # written (its ONNX symbolic reads them).

    def _scripted_input(self, input: Tensor) -> Tensor:
        """x as rnnc::forward takes it: float32, with a batch."""
        if (input.dim() != 2 and input.dim() != 3) or input.size(-1) != self.input_size:
            raise ValueError("input has shape {}, expected [T, B, input_size] ([B, T, input_size] "
                             "with batch_first, or [T, input_size]) with input_size = {}"
                             .format(input.shape, self.input_size))
        if input.dim() == 2:
            return input.float().unsqueeze(0 if self.batch_first else 1)
        return input.float()

    def _scripted_state(self, input: Tensor, x: Tensor, given: Optional[Tensor], index: int,
                        width: int) -> Tensor:
        """Initial state `index` (hx[index]) as rnnc::forward takes it, checked; zeros if none."""
        slots = self.num_layers * (2 if self.bidirectional else 1)
        batch = x.size(0 if self.batch_first else 1)
        if given is None:
            return x.new_zeros([slots, batch, width])
        expected = [slots, batch, width] if input.dim() == 3 else [slots, width]
        if given.shape != expected:
            raise ValueError("hx[{}] has shape {}, expected {} [num_layers * num_directions, "
                             "batch, features]".format(index, given.shape, expected))
        return given.float() if input.dim() == 3 else given.float().unsqueeze(1)

    def _scripted_result(self, input: Tensor, result: Tensor, is_state: bool) -> Tensor:
        """An output or final state in the input's type, without a batch where it had none."""
        result = result.to(input.dtype)
        if input.dim() == 2:
            return result.squeeze(1 if is_state or not self.batch_first else 0)
        return result

    def _scripted_hidden(self, input: Tensor, hx: Optional[Tensor],
                         lengths: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
        """GRU's and RNN's TorchScript forward of a padded tensor (LSTM has its own: two
        states)."""
        x = self._scripted_input(input)
        h0 = self._scripted_state(input, x, hx, 0,
                                  self.proj_size if self.proj_size > 0 else self.hidden_size)
        y, h_n = torch.ops.rnnc.forward(self._scripted_spec(), x, [h0], lengths, [],
                                        self._flat_weights)
        return self._scripted_result(input, y, False), self._scripted_result(input, h_n, True)

    def _padded_forward(self, input: Tensor, hx: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        return self._scripted_hidden(input, hx, None)

    def _packed_hidden(self, input: PackedSequence,
                       hx: Optional[Tensor]) -> Tuple[PackedSequence, Tensor]:
        """The TorchScript forward of a PackedSequence: padded, run with its lengths and packed
        again as it was (the states in the batch's own order, as torch.nn's modules take and
        give them)."""
        padded, lengths = pad_packed_sequence(input, self.batch_first)
        y, h_n = self._scripted_hidden(padded, hx, lengths)
        return repack(y, input, self.batch_first), h_n


# TorchScript compiles a forward once per signature declared by torch._jit_internal.
# _overload_method, as torch.nn's own modules declare theirs (a padded tensor gives a tensor, a
# PackedSequence a PackedSequence). It finds a class's declarations by the class's name and its
# lines, so each module declares them in its own body and shares the rest.


class LSTM(_RnncForward, torch.nn.LSTM):
    """torch.nn.LSTM trained through rnnc (options: threads, jit, target_cpu, weights_dtype)."""

    @torch._jit_internal._overload_method  # noqa: F811
    def forward(self, input: Tensor, hx: Optional[Tuple[Tensor, Tensor]] = None
                ) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
        pass

    @torch._jit_internal._overload_method  # noqa: F811
    def forward(self, input: PackedSequence, hx: Optional[Tuple[Tensor, Tensor]] = None
                ) -> Tuple[PackedSequence, Tuple[Tensor, Tensor]]:
        pass

    def forward(self, input, hx=None):  # noqa: F811
        if not torch.jit.is_scripting():
            return self._eager_forward(input, hx)
        if isinstance(input, PackedSequence):
            padded, lengths = pad_packed_sequence(input, self.batch_first)
            y, finals = self._scripted_lstm(padded, hx, lengths)
            return repack(y, input, self.batch_first), finals
        else:
            return self._scripted_lstm(input, hx, None)

    def _padded_forward(self, input: Tensor, hx: Optional[Tuple[Tensor, Tensor]] = None
                        ) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
        return self._scripted_lstm(input, hx, None)

    def _scripted_lstm(self, input: Tensor, hx: Optional[Tuple[Tensor, Tensor]],
                       lengths: Optional[Tensor]) -> Tuple[Tensor, Tuple[Tensor, Tensor]]:
        x = self._scripted_input(input)
        h0 = self._scripted_state(input, x, None if hx is None else hx[0], 0,
                                  self.proj_size if self.proj_size > 0 else self.hidden_size)
        c0 = self._scripted_state(input, x, None if hx is None else hx[1], 1, self.hidden_size)
        y, h_n, c_n = torch.ops.rnnc.forward(self._scripted_spec(), x, [h0, c0], lengths, [],
                                             self._flat_weights)
        return self._scripted_result(input, y, False), (self._scripted_result(input, h_n, True),
                                                        self._scripted_result(input, c_n, True))


class GRU(_RnncForward, torch.nn.GRU):
    """torch.nn.GRU trained through rnnc."""

    @torch._jit_internal._overload_method  # noqa: F811
    def forward(self, input: Tensor, hx: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        pass

    @torch._jit_internal._overload_method  # noqa: F811
    def forward(self, input: PackedSequence, hx: Optional[Tensor] = None
                ) -> Tuple[PackedSequence, Tensor]:
        pass

    def forward(self, input, hx=None):  # noqa: F811
        if not torch.jit.is_scripting():
            return self._eager_forward(input, hx)
        if isinstance(input, PackedSequence):
            return self._packed_hidden(input, hx)
        else:
            return self._scripted_hidden(input, hx, None)


class RNN(_RnncForward, torch.nn.RNN):
    """torch.nn.RNN (tanh or relu) trained through rnnc."""

    @torch._jit_internal._overload_method  # noqa: F811
    def forward(self, input: Tensor, hx: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
        pass

    @torch._jit_internal._overload_method  # noqa: F811
    def forward(self, input: PackedSequence, hx: Optional[Tensor] = None
                ) -> Tuple[PackedSequence, Tensor]:
        pass

    def forward(self, input, hx=None):  # noqa: F811
        if not torch.jit.is_scripting():
            return self._eager_forward(input, hx)
        if isinstance(input, PackedSequence):
            return self._packed_hidden(input, hx)
        else:
            return self._scripted_hidden(input, hx, None)


class _RnncCellForward(_RnncModule):
    """The forward of torch.nn.LSTMCell, GRUCell and RNNCell, run by rnnc (mixed into torch's own
    modules): one step of the built-in cell. Evaluation (a call autograd does not record) runs
    the inference program; a recorded call runs the training program over the step, both kept
    while the parameters keep their values, so that a loop stepping the cell between optimiser
    steps builds each once."""

    def _rnnc_cell(self):
        if isinstance(self, torch.nn.RNNCell):
            return "rnn_tanh" if self.nonlinearity == "tanh" else "rnn_relu"
        return "lstm" if isinstance(self, torch.nn.LSTMCell) else "gru"

    def _param_names(self):
        return ["weight_ih", "weight_hh"] + (["bias_ih", "bias_hh"] if self.bias else [])

    def _spec(self):
        states = ["h", "c"] if isinstance(self, torch.nn.LSTMCell) else ["h"]
        return _torch_op.spec(self._rnnc_cell(), {}, (1, False, False), self._param_names(),
                              states, [], self._rnnc_options)

    def _eager_forward(self, input, hx):
        if torch.onnx.is_in_onnx_export():
            return self._onnx_forward(input, hx)
        lstm = isinstance(self, torch.nn.LSTMCell)
        if not isinstance(input, torch.Tensor) or not input.is_floating_point():
            raise TypeError(f"{type(self).__name__} takes a floating-point tensor, not "
                            f"{getattr(input, 'dtype', type(input).__name__)}")
        _, batch, expected = cell_step(self, input.shape)
        if hx is None:
            states = [input.new_zeros((1, batch, self.hidden_size), dtype=torch.float32)
                      for _ in range(1 + lstm)]
        else:
            states = []
            for _, label, state in given_states(lstm, hx, cell=True):
                check_state_shape(label, state.shape, expected, CELL_STATE_LAYOUT)
                states.append(state.float().reshape(1, batch, self.hidden_size))
        dtype = input.dtype  # rnnc computes in float32; the results come back in the input's type
        x = input.float().reshape(1, batch, self.input_size)  # a sequence of one step
        names = self._param_names()
        params = [getattr(self, name).float() for name in names]
        state_names = ["h", "c"] if lstm else ["h"]

        def build(make, *training_args, **training_options):
            return lambda weights: _program(make, self, self._rnnc_cell(),
                                            dict(zip(names, weights)), {}, *training_args,
                                            layout=(1, False, False), **training_options)

        if _torch_op.tracing():
            y, *finals = torch.ops.rnnc.forward(self._spec(), x, states, None, [], params)
        elif batch == 0:
            y, finals = _empty_batch(self, x, states, params, self.hidden_size)
        elif not records_gradients(x, *states, *params):
            layer = _inference_programs.get(self, names, params, build(_rnnc.Layer))
            y, finals = _infer(layer, x, state_names, states, None)
        else:
            program = _training_programs.get(self, names, params,
                                             build(_rnnc.Training, 0.0, 0, training=False))
            summed = summed_parameters(self, names, params)
            recompute = torch_recurrence(self._rnnc_cell(), 1, False, False, self.bias, None)
            y, *finals = _Recurrence.apply(program, state_names, [], names, summed, recompute, x,
                                           None, None, *_token(summed), *states, *params)
        _, finals = _in_type(dtype, y, finals)
        finals = [f.reshape(expected) for f in finals]
        return (finals[0], finals[1]) if lstm else finals[0]

    # The step in TorchScript: what _eager_forward does, around rnnc::forward over a sequence of
    # one step, straight-line as the layers' (see _RnncForward).

    def _scripted_input(self, input: Tensor) -> Tensor:
        """x as rnnc::forward takes it: float32, a sequence of one step [1, batch, input_size]."""
        if (input.dim() != 1 and input.dim() != 2) or input.size(-1) != self.input_size:
            raise ValueError("input has shape {}, expected [batch, input_size] or [input_size] "
                             "with input_size = {}".format(input.shape, self.input_size))
        return input.float().reshape([1, -1, self.input_size])

    def _scripted_state(self, input: Tensor, x: Tensor, given: Optional[Tensor],
                        index: int) -> Tensor:
        """Initial state `index` (hx[index]) as rnnc::forward takes it, checked; zeros if none."""
        batch = x.size(1)
        if given is None:
            return x.new_zeros([1, batch, self.hidden_size])
        expected = [batch, self.hidden_size] if input.dim() == 2 else [self.hidden_size]
        if given.shape != expected:
            raise ValueError("hx[{}] has shape {}, expected {} (as the input's batch)"
                             .format(index, given.shape, expected))
        return given.float().reshape([1, batch, self.hidden_size])

    def _scripted_params(self) -> List[Tensor]:
        bias_ih, bias_hh = self.bias_ih, self.bias_hh
        if bias_ih is not None and bias_hh is not None:
            return [self.weight_ih, self.weight_hh, bias_ih, bias_hh]
        return [self.weight_ih, self.weight_hh]

    def _scripted_result(self, input: Tensor, final: Tensor) -> Tensor:
        """A final state as torch.nn's cells give it: [batch, hidden_size], or [hidden_size]."""
        final = final.to(input.dtype)
        if input.dim() == 2:
            return final.reshape([input.size(0), self.hidden_size])
        return final.reshape([self.hidden_size])


class LSTMCell(_RnncCellForward, torch.nn.LSTMCell):
    """torch.nn.LSTMCell trained through rnnc (options: threads, jit, target_cpu,
    weights_dtype)."""

    def forward(self, input: Tensor, hx: Optional[Tuple[Tensor, Tensor]] = None
                ) -> Tuple[Tensor, Tensor]:
        if not torch.jit.is_scripting():
            return self._eager_forward(input, hx)
        x = self._scripted_input(input)
        h0 = self._scripted_state(input, x, None if hx is None else hx[0], 0)
        c0 = self._scripted_state(input, x, None if hx is None else hx[1], 1)
        _, h_n, c_n = torch.ops.rnnc.forward(self._rnnc_spec, x, [h0, c0], None, [],
                                             self._scripted_params())
        return self._scripted_result(input, h_n), self._scripted_result(input, c_n)


class _HiddenCellForward(_RnncCellForward):
    """The step of the cells whose state is h alone (GRUCell, RNNCell), typed for TorchScript."""

    def forward(self, input: Tensor, hx: Optional[Tensor] = None) -> Tensor:
        if not torch.jit.is_scripting():
            return self._eager_forward(input, hx)
        x = self._scripted_input(input)
        h0 = self._scripted_state(input, x, hx, 0)
        _, h_n = torch.ops.rnnc.forward(self._rnnc_spec, x, [h0], None, [],
                                        self._scripted_params())
        return self._scripted_result(input, h_n)


class GRUCell(_HiddenCellForward, torch.nn.GRUCell):
    """torch.nn.GRUCell trained through rnnc."""


class RNNCell(_HiddenCellForward, torch.nn.RNNCell):
    """torch.nn.RNNCell (tanh or relu) trained through rnnc."""


def _refuse_export_in_training():
    """torch.onnx.export of a Recurrent that draws dropout masks (in training)."""
    raise RuntimeError("rnnc.nn.Recurrent exports in eval mode: in training its dropout masks "
                       "are rnnc's own")


class Recurrent(_WeightsDtype, torch.nn.Module):
    """Any cell as a layer trained through rnnc: ``cell`` is a ``.cell`` file, the cell's source
    or a built-in name, and every size its parameters need is a keyword (``input_size=8,
    hidden_size=32, ...``). The parameters are the cell's, one set per layer and direction,
    named as the runtime reads them (``w_l0``, ``w_l0_reverse``, ``w_l1``, ...; a dot in a
    cell's name becomes ``_``), each uniform in [-1/sqrt(hidden_size), 1/sqrt(hidden_size)] (or
    over the square root of its last dimension without a hidden_size), as torch.nn's recurrent
    modules start. Layers past the first read the layer below (its outputs, both directions side
    by side). ``dropout``: between layers, in training mode.

    ``forward(x, states=None, lengths=None, seed=None, **side_inputs)`` returns the output and
    every final state by name: x [T, B, input_size] ([B, T, input_size] with batch_first) or a
    PackedSequence (the output one too), each state [num_layers * num_directions, B, F] (absent
    ones start at zero), lengths [B] (each sequence's own, with a padded x). A cell with several
    inputs (``input x[input_size], context[context_size]``) takes the others by name, laid out
    as x (padded, or PackedSequences of x's lengths where x is one); every layer and direction
    reads them at the same step, and they get gradients as x does. In training
    mode the cell's dropouts (and those between layers) draw their masks from ``seed``, or from
    torch's generator when it is None; in eval mode they are the identity. Options as
    rnnc.nn.LSTM's: threads, jit, target_cpu, weights_dtype.

    Side inputs may also come as one dict, ``side_inputs={"context": c}``, which is how a
    TorchScript model gives them: in TorchScript (torch.jit.script of a model holding it, or of
    the layer), forward takes x padded or a PackedSequence, states as a Dict[str, Tensor],
    lengths (with a padded x) and side_inputs as a Dict[str, Tensor] (each laid out as the
    padded x)."""

    # What the TorchScript forward reads (__prepare_scriptable__), typed: a cell may have no side
    # inputs, and TorchScript cannot type an empty list.
    _rnnc_side_names: List[str]
    _rnnc_side_widths: List[int]

    def __init__(self, cell, num_layers=1, bidirectional=False, batch_first=False, dropout=0.0,
                 *, threads=0, jit=True, target_cpu="", weights_dtype="fp32", **sizes):
        super().__init__()
        if not isinstance(num_layers, int) or num_layers <= 0:
            raise ValueError(f"num_layers must be a positive integer, not {num_layers!r}")
        if not 0 <= dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), not {dropout!r}")
        self.cell = str(cell)
        self.sizes = {name: int(value) for name, value in sizes.items()}
        self.num_layers, self.bidirectional = num_layers, bool(bidirectional)
        self.batch_first, self.dropout = bool(batch_first), float(dropout)
        self._rnnc_options = rnnc_options(jit, threads, target_cpu, weights_dtype)
        signature = _rnnc.cell_signature(self.cell, self.sizes)
        self.side_input_names = list(signature["inputs"][1:])
        # (-1 where the sizes given do not fix a side input's width)
        self._side_widths = dict(signature.get("side_input_widths", {}))
        self._cell_drops = signature["dropout"]
        # (None where the input's width is no one size, such as x[2 * half]: no stacking then)
        self._input_size = signature["input_size"]
        self.state_sizes = dict(signature["states"])
        directions = 2 if self.bidirectional else 1
        # (runtime name, attribute name) of every parameter, in the order the backward returns.
        self._params = []
        bound = self.sizes.get("hidden_size")
        for layer in range(num_layers):
            layer_sizes = dict(self.sizes)
            if layer > 0:  # the layer below's width, under the cell's name for its input size
                if self._input_size is None:
                    raise ValueError(f"num_layers={num_layers}: the layers above the first read "
                                     "the one below, but this cell's input's width is no one "
                                     "size (x[input_size]) to give that width")
                layer_sizes[self._input_size] = signature["output"] * directions
            for direction in range(directions):
                suffix = f"_l{layer}" + ("_reverse" if direction else "")
                for name, shape in _rnnc.cell_params(self.cell, layer_sizes).items():
                    k = 1.0 / (bound or shape[-1]) ** 0.5
                    attribute = name.replace(".", "_") + suffix
                    self.register_parameter(
                        attribute, torch.nn.Parameter(torch.empty(shape).uniform_(-k, k)))
                    self._params.append((name + suffix, attribute))

    def __getstate__(self):
        return _ProgramCache.without(super().__getstate__())

    def _cell_source(self):
        """The cell as a traced model keeps it: a .cell file's source rather than its path."""
        if "{" not in self.cell and self.cell.endswith(".cell") and os.path.isfile(self.cell):
            with open(self.cell, encoding="utf-8") as f:
                return f.read()
        return self.cell

    def ir(self, after=None, grad=False):
        """The cell's IR through rnnc's passes, with the sizes given (see rnnc.Layer.ir;
        ``grad=True``: the backward step rnnc derives for training)."""
        return _rnnc.cell_ir(self.cell, self.sizes, after, grad)

    def __prepare_scriptable__(self):
        """What the TorchScript forward reads, as the module is now: rnnc::forward's spec, the
        parameters in the cell's order, and the states' names and widths."""
        names = [name for name, _ in self._params]
        self._rnnc_spec = self._spec(names)
        self._rnnc_training_spec = self._spec(names, self._training_dropout())
        self._rnnc_params = [getattr(self, attribute) for _, attribute in self._params]
        self._rnnc_state_names = list(self.state_sizes)
        self._rnnc_state_widths = list(self.state_sizes.values())
        self._rnnc_side_names = list(self.side_input_names)
        widths = self.__dict__.get("_side_widths", {})  # (absent in a module pickled before)
        self._rnnc_side_widths = [int(widths.get(name, -1)) for name in self.side_input_names]
        self._rnnc_input_width = int(self.sizes.get(self._input_size, -1))
        if not _scripted_alone():
            return self
        # Alone, as torch.nn's modules (_RnncForward's): a copy, sharing the parameters, whose
        # forward takes the padded x, since torch compiles an overloaded forward only where a
        # caller picks one of its signatures.
        return _alone(self, self._scripted_padded)

    def _spec(self, names, training_dropout=None, seed=None):
        """rnnc::forward's spec (_torch_op.spec) for this layer: in training where it draws
        masks, `training_dropout` (see _training_dropout), and a seed where the call gives one."""
        return _torch_op.spec(
            self._cell_source(), self._sizes_of_program(),
            (self.num_layers, self.bidirectional, self.batch_first), names,
            list(self.state_sizes), list(self.side_input_names), self._rnnc_options,
            self._input_size, training_dropout, seed)

    def _training_dropout(self):
        """A call in training mode: the p between layers where it draws masks, else None."""
        if not (self._cell_drops or (self.dropout > 0 and self.num_layers > 1)):
            return None
        return self.dropout if self.num_layers > 1 else 0.0

    def _sizes_of_program(self):
        """The sizes a program is built with: the input's width changes with the layer, so the
        weights give it where there are some."""
        return {n: v for n, v in self.sizes.items() if n != self._input_size or not self._params}

    # The forward's signatures in TorchScript, as torch.nn's modules declare theirs (see LSTM's):
    # a padded x gives a tensor, a PackedSequence a PackedSequence (its side inputs padded).
    @torch._jit_internal._overload_method  # noqa: F811
    def forward(self, x: Tensor, states: Optional[Dict[str, Tensor]] = None,
                lengths: Optional[Tensor] = None, side_inputs: Optional[Dict[str, Tensor]] = None
                ) -> Tuple[Tensor, Dict[str, Tensor]]:
        pass

    @torch._jit_internal._overload_method  # noqa: F811
    def forward(self, x: PackedSequence, states: Optional[Dict[str, Tensor]] = None,
                lengths: Optional[Tensor] = None, side_inputs: Optional[Dict[str, Tensor]] = None
                ) -> Tuple[PackedSequence, Dict[str, Tensor]]:
        pass

    def _scripted_forward(self, x: Tensor, states: Optional[Dict[str, Tensor]] = None,
                          lengths: Optional[Tensor] = None,
                          side_inputs: Optional[Dict[str, Tensor]] = None):
        """The forward in TorchScript, compiled once per signature above where a caller picks
        it (a subclass, which TorchScript gives no overloads, compiles x: Tensor alone): a
        PackedSequence padded, run with its lengths and packed again as it came (side inputs
        laid out as the padded x)."""
        if isinstance(x, PackedSequence):
            if lengths is not None:
                raise ValueError("a PackedSequence carries its lengths: give no lengths")
            padded, packed_lengths = pad_packed_sequence(x, self.batch_first)
            y, finals = self._scripted_padded(padded, states, packed_lengths, side_inputs)
            return repack(y, x, self.batch_first), finals
        else:
            return self._scripted_padded(x, states, lengths, side_inputs)

    def _scripted_padded(self, x: Tensor, states: Optional[Dict[str, Tensor]] = None,
                         lengths: Optional[Tensor] = None,
                         side_inputs: Optional[Dict[str, Tensor]] = None
                         ) -> Tuple[Tensor, Dict[str, Tensor]]:
        """The forward in TorchScript of a padded x (lengths, side inputs laid out as x), around
        rnnc::forward. The shapes are checked here, as torch 1.13's interpreter drops the
        message of an exception raised in a Python kernel."""
        if x.dim() != 3 or (self._rnnc_input_width >= 0
                            and x.size(2) != self._rnnc_input_width):
            raise ValueError("x has shape {}, expected [T, B, {}] ([B, T, {}] with batch_first)"
                             .format(x.shape, self._rnnc_input_width, self._rnnc_input_width))
        batch = x.size(0 if self.batch_first else 1)
        slots = self.num_layers * (2 if self.bidirectional else 1)
        given: Dict[str, Tensor] = {}
        if states is not None:
            given = states
        for name in given.keys():
            if name not in self._rnnc_state_names:
                raise ValueError("the cell has no state {}; its states: {}"
                                 .format(name, ", ".join(self._rnnc_state_names)))
        if lengths is not None and lengths.shape != [batch]:
            raise ValueError("lengths has shape {}, expected [{}] (one per sequence)"
                             .format(lengths.shape, batch))
        initial: List[Tensor] = []
        for name, width in zip(self._rnnc_state_names, self._rnnc_state_widths):
            if name in given:
                state = given[name]
                if state.shape != [slots, batch, width]:
                    raise ValueError("{} has shape {}, expected {} [num_layers * num_directions, "
                                     "batch, features]".format(name, state.shape,
                                                               [slots, batch, width]))
                initial.append(state.float())
            else:
                initial.append(x.new_zeros([slots, batch, width]).float())
        sides: Dict[str, Tensor] = {}
        if side_inputs is not None:
            sides = side_inputs
        for name in sides.keys():
            if name not in self._rnnc_side_names:
                raise ValueError("the cell has no input {}; its side inputs: {}".format(
                    name, ", ".join(self._rnnc_side_names) if len(self._rnnc_side_names) > 0
                    else "none"))
        ordered: List[Tensor] = []
        for name, width in zip(self._rnnc_side_names, self._rnnc_side_widths):
            if name not in sides:
                raise ValueError("the cell reads {} besides x: give it in side_inputs, laid out "
                                 "as x".format(name))
            side = sides[name]
            if (side.dim() != 3 or side.size(0) != x.size(0) or side.size(1) != x.size(1)
                    or (width >= 0 and side.size(2) != width)):
                raise ValueError("side input {} has shape {}, expected [{}, {}, {}] (laid out as "
                                 "x)".format(name, side.shape, x.size(0), x.size(1),
                                             str(width) if width >= 0 else "features"))
            ordered.append(side.float())
        # (in training, where the module draws masks, the spec drawing them at each call)
        spec = self._rnnc_training_spec if self.training else self._rnnc_spec
        out = torch.ops.rnnc.forward(spec, x.float(), initial, lengths, ordered,
                                     [p.float() for p in self._rnnc_params])
        finals: Dict[str, Tensor] = {}
        for i, name in enumerate(self._rnnc_state_names):
            finals[name] = out[i + 1].to(x.dtype)
        return out[0].to(x.dtype), finals

    def forward(self, x, states=None, lengths=None, seed=None, side_inputs=None,  # noqa: F811
                **named_sides):
        if isinstance(side_inputs, dict):  # (as a TorchScript model gives them)
            if named_sides:
                raise ValueError("give side inputs either in side_inputs or as keywords, not "
                                 "both")
            named_sides = dict(side_inputs)
        elif side_inputs is not None:  # a cell's side input called side_inputs
            named_sides["side_inputs"] = side_inputs
        return self._eager_forward(x, states, lengths, seed, named_sides)

    # TorchScript cannot compile **side_inputs; it reads a forward's source and signature through
    # inspect, which follows __wrapped__, so a scripted model compiles the typed forward above
    # while Python calls this one.
    forward.__wrapped__ = _scripted_forward

    def _eager_forward(self, x, states, lengths, seed, side_inputs):
        packed_input = x if isinstance(x, PackedSequence) else None
        if packed_input is not None and torch.onnx.is_in_onnx_export():
            return self._exported_packed(packed_input, states, lengths, side_inputs)
        if packed_input is not None:
            if lengths is not None:
                raise ValueError("a PackedSequence carries its lengths: give no lengths")
            x, lengths = pad_packed_sequence(packed_input, batch_first=self.batch_first)
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.dim() != 3:
            raise TypeError("Recurrent takes a 3-D floating-point tensor [T, B, input_size] "
                            f"([B, T, input_size] with batch_first), not {x!r:.80}")
        dtype = x.dtype  # rnnc computes in float32; the results come back in the input's type
        x = x.float()
        sides = self._side_inputs(side_inputs, packed_input, lengths)
        batch = x.shape[0 if self.batch_first else 1]
        slots = self.num_layers * (2 if self.bidirectional else 1)
        states = self._named_states(states)
        initial = []
        for name, width in self.state_sizes.items():
            state = states.get(name)
            if state is None:
                state = x.new_zeros((slots, batch, width))
            check_state_shape(name, tuple(state.shape), (slots, batch, width))
            initial.append(state.float())
        traced = _torch_op.tracing()
        if lengths is not None and not traced:
            lengths = torch.as_tensor(lengths).cpu().numpy().astype("int64")
        # Masks are drawn in training where the cell has a dropout or layers have one between
        # them; otherwise the seed changes nothing (and the program is kept, as below).
        draws = self.training and self._training_dropout() is not None
        given_seed = seed
        if not draws:
            seed = 0
        elif seed is None:
            seed = int(torch.randint(0, 2**62, ()))
        names = [name for name, _ in self._params]
        params = [getattr(self, attribute).float() for _, attribute in self._params]
        sizes = self._sizes_of_program()
        state_names = list(self.state_sizes)
        if torch.onnx.is_in_onnx_export():
            # rnnc::forward has no ONNX form: the exporter records the forward in torch's own
            # operations instead (torch.nn's recurrence, ONNX's LSTM, GRU or RNN, for those
            # cells; any other cell's IR, step by step: unrolled over the example's steps).
            if draws:
                _refuse_export_in_training()
            if self.cell not in _torch_op.TORCH_CELLS:
                warnings.warn(f"rnnc.nn.Recurrent exports its cell unrolled over the example's "
                              f"{x.shape[1 if self.batch_first else 0]} steps: the ONNX model "
                              "takes sequences of that length only", torch.jit.TracerWarning)
            y, finals = self._torch_form(names, lengths)(x, initial, list(sides.values()),
                                                         params)
        elif traced:  # (in training, where it draws masks: a seed per call, or the one given)
            if lengths is not None:
                lengths = torch.as_tensor(lengths)
            spec = self._spec(names, self._training_dropout() if draws else None, given_seed)
            y, *finals = torch.ops.rnnc.forward(spec, x, initial, lengths, list(sides.values()),
                                                params)
        # In eval mode the cell's dropouts are the identity, as in inference.
        elif not self.training and not records_gradients(x, *initial, *sides.values(), *params):
            layer = _inference_programs.get(self, names, params, lambda weights: _program(
                _rnnc.Layer, self, self.cell, dict(zip(names, weights)), sizes))
            y, finals = _infer(layer, x, state_names, initial, lengths, sides)
        else:
            # One program until the weights change, each call drawing its masks from its seed;
            # but a cell dropping a weight draws that mask when the program is built, so there
            # the seed is part of the program (the module learns which at its first build).
            seeded = self.__dict__.get("_rnnc_masks_at_build", False)
            program = _training_programs.get(
                self, names, params, lambda weights: _program(
                    _rnnc.Training, self, self.cell, dict(zip(names, weights)), sizes,
                    self.dropout if self.training else 0.0, int(seed), training=self.training),
                key=(self.training, self.dropout, int(seed) if seeded else None))
            if program.draws_masks_at_build and not seeded:
                self.__dict__["_rnnc_masks_at_build"] = True  # built with this call's seed
            summed = summed_parameters(self, names, params)
            recompute = self._torch_form(names, lengths,
                                         (int(seed), self.dropout) if draws else None)
            y, *finals = _Recurrence.apply(program, state_names, list(sides), names, summed,
                                           recompute, x, lengths, int(seed), *_token(summed),
                                           *initial, *sides.values(), *params)
        y, finals = _in_type(dtype, y, finals)
        if packed_input is not None:
            y = repack(y, packed_input, self.batch_first)
        return y, dict(zip(state_names, finals))

    def _exported_packed(self, packed, states, lengths, side_inputs):
        """Under torch.onnx.export, a PackedSequence runs torch.nn's packed recurrence, for the
        cells torch has one of: torch's exporter then finds its own pattern (pack, recurrence,
        pad) and gives ONNX's LSTM, GRU or RNN operator with sequence_lens, as for torch.nn's
        module. Unpacked here, the batch would be packed again, which it cannot export."""
        if self.cell not in _torch_op.TORCH_CELLS or side_inputs:
            raise RuntimeError("rnnc.nn.Recurrent exports a PackedSequence for the cells ONNX has "
                               f"operators of ({', '.join(_torch_op.TORCH_CELLS)}): give this "
                               "one x padded (and lengths), which exports unrolled")
        if lengths is not None:
            raise ValueError("a PackedSequence carries its lengths: give no lengths")
        if self.training and self._training_dropout() is not None:
            _refuse_export_in_training()
        slots = self.num_layers * (2 if self.bidirectional else 1)
        states = self._named_states(states)
        for name, width in self.state_sizes.items():
            if states.get(name) is not None:  # (the batch read where needed: a node of its own)
                check_state_shape(name, tuple(states[name].shape),
                                  (slots, int(packed.batch_sizes[0]), width))
        initial = [states.get(name) for name in self.state_sizes]
        names = [name for name, _ in self._params]
        y, finals = packed_recurrence(
            self.cell, self.num_layers, self.bidirectional,
            any(name.startswith("bias") for name in names), packed, initial,
            [getattr(self, attribute) for _, attribute in self._params])
        return y, dict(zip(self.state_sizes, finals))

    def _named_states(self, states):
        """The initial states given, by name (none: an empty dict); a name the cell has no state
        of is an error naming the cell's."""
        states = dict(states or {})
        unknown = set(states) - set(self.state_sizes)
        if unknown:
            raise ValueError(f"the cell has no state {', '.join(sorted(unknown))}; its states: "
                             f"{', '.join(self.state_sizes)}")
        return states

    def _torch_form(self, names, lengths, drawn=None):
        """The forward in torch's own operations (for a second derivative and an ONNX
        export): torch_recurrence's, for this layer's cell, layout and call's lengths, and a
        training call's (seed, dropout between layers), whose masks it applies as rnnc drew
        them."""
        return torch_recurrence(self.cell, self.num_layers, self.bidirectional, self.batch_first,
                                any(name.startswith("bias") for name in names), lengths,
                                self.sizes, self._input_size, drawn)

    def _side_inputs(self, given, packed_input, lengths):
        """The side inputs by name, in the cell's order, as float32 tensors laid out as the
        (padded) input; a PackedSequence where the input is one must have its lengths."""
        missing = [name for name in self.side_input_names if name not in given]
        unknown = sorted(set(given) - set(self.side_input_names))
        if unknown:
            raise ValueError(f"the cell has no input {', '.join(unknown)}; its side inputs: "
                             f"{', '.join(self.side_input_names) or 'none'}")
        if missing:
            raise ValueError(f"the cell reads {', '.join(missing)} besides x: give each as a "
                             "keyword argument laid out as x")
        sides = {}
        for name in self.side_input_names:
            side = given[name]
            if isinstance(side, PackedSequence):
                if packed_input is None:
                    raise TypeError(f"side input {name} is a PackedSequence, but x is not: give "
                                    "both packed, or both padded")
                side, side_lengths = pad_packed_sequence(side, batch_first=self.batch_first)
                if not torch.equal(side_lengths, lengths):
                    raise ValueError(f"side input {name} is packed with lengths "
                                     f"{side_lengths.tolist()}, x with {lengths.tolist()}")
            if not isinstance(side, torch.Tensor) or not side.is_floating_point():
                raise TypeError(f"side input {name} must be a floating-point tensor laid out as "
                                f"x, not {side!r:.80}")
            sides[name] = side.float()
        return sides
