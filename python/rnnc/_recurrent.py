"""What rnnc.LSTM (numpy or torch) and rnnc.nn.LSTM (torch) share, and their one-step cells: the
initial states torch.nn takes as hx, checked against the shapes it expects, whether autograd
records a call, and the built-in cell a module runs."""

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


def refuse_tracing(what, instead):
    """torch.jit.trace would record the result of a call that runs on numpy views as a constant
    (the traced model giving the traced input's output for every input): refused, naming the
    torch.nn.Module that traces as the operator rnnc::forward."""
    torch = sys.modules.get("torch")
    if torch is not None and torch._C._get_tracing_state() is not None:
        raise RuntimeError(
            f"torch.jit.trace cannot record a call of {what}, which is not a torch.nn.Module: its "
            f"result would be traced as a constant. Use {instead} (the same layer as a "
            "torch.nn.Module, which torch.jit.trace and torch.jit.script record as the operator "
            "rnnc::forward)")


def state_shapes(module, lstm, batch):
    """Each state's [num_layers * num_directions, batch, features], by name ("h", and "c")."""
    slots = module.num_layers * (2 if module.bidirectional else 1)
    shapes = {"h": [slots, batch, module.proj_size or module.hidden_size]}
    if lstm:
        shapes["c"] = [slots, batch, module.hidden_size]
    return shapes


def given_states(lstm, hx, cell=False):
    """hx as torch.nn takes it ((h_0, c_0) for an LSTM, h_0 otherwise) as (name, label, value);
    a one-step cell's (cell=True) labelled as torch's cells name them (hx, hx[0], hx[1])."""
    h, c = ("", "") if cell else (" (h_0)", " (c_0)")
    if not lstm:
        return [("h", "hx" + h, hx)]
    if not isinstance(hx, (tuple, list)) or len(hx) != 2:
        raise ValueError(f"{'LSTMCell' if cell else 'LSTM'} expects hx as a tuple (h_0, c_0)")
    return [("h", "hx[0]" + h, hx[0]), ("c", "hx[1]" + c, hx[1])]


def check_state_shape(label, shape, expected,
                      layout="[num_layers * num_directions, batch, features]"):
    if list(shape) != list(expected):
        raise ValueError(f"{label} has shape {list(shape)}, expected {list(expected)} {layout}")


# A one-step cell's states: as its input's batch.
CELL_STATE_LAYOUT = "(as the input's batch: [batch, hidden_size] or [hidden_size])"


def cell_step(module, input_shape):
    """A one-step cell's input shape as torch.nn's cells take it ([batch, input_size], or
    [input_size] unbatched), checked: (batched, batch, the shape each state must have)."""
    if len(input_shape) not in (1, 2):
        raise ValueError(f"{type(module).__name__}: Expected input to be 1D or 2D, got "
                         f"{len(input_shape)}D input of shape {list(input_shape)}")
    batched = len(input_shape) == 2
    batch = input_shape[0] if batched else 1
    if input_shape[-1] != module.input_size:
        raise ValueError(f"input has shape {list(input_shape)}, expected "
                         f"{[batch, module.input_size] if batched else [module.input_size]}"
                         " ([batch, input_size] or [input_size])")
    return batched, batch, [batch, module.hidden_size] if batched else [module.hidden_size]



def ir_cell(cell, module):
    """The built-in cell a torch-shaped module runs and its sizes, as _rnnc.cell_ir takes them (an
    LSTM with projections runs lstm_proj)."""
    sizes = {"input_size": module.input_size, "hidden_size": module.hidden_size}
    if getattr(module, "proj_size", 0):
        return "lstm_proj", dict(sizes, proj_size=module.proj_size)
    return cell, sizes
