"""rnnc's training forward and the backward it derives from the cell, as a torch.autograd.Function
(rnnc.nn's modules, and rnnc.LSTM or rnnc.Layer inside a model that trains)."""

import torch


def _initial_name(state):
    """The name the runtime gives an initial state's gradient."""
    return state + "0" if state in ("h", "c") else state


class _NoSecondDerivative(torch.autograd.Function):
    """A gradient rnnc computed, where autograd records the backward (``create_graph=True``),
    made to depend on the forward's inputs and the output gradients it came from, so that a
    second derivative through it reaches this function and is refused. rnnc derives first
    derivatives only; without this, autograd would see no path from the gradient back to the
    input and give a second derivative of None (zero with ``allow_unused=True``)."""

    @staticmethod
    def forward(ctx, gradient, *sources):
        return gradient.clone()

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError(
            "rnnc's layers give first derivatives only: a second derivative through one (a "
            "gradient of gradients taken with create_graph=True, as a gradient penalty needs) is "
            "not supported")


class _Recurrence(torch.autograd.Function):
    """y and the final states from x, the initial states, the side inputs (a cell's inputs past
    its first, by name) and the parameters, all float32. An initial state given as None starts at
    zero (and has no gradient)."""

    @staticmethod
    def forward(ctx, program, state_names, side_names, param_names, x, lengths, *tensors):
        initial = tensors[:len(state_names)]
        sides = tensors[len(state_names):len(state_names) + len(side_names)]
        states = {name: t.detach().contiguous().numpy()
                  for name, t in zip(state_names, initial) if t is not None}
        y, finals, tape = program.forward(
            x.detach().contiguous().numpy(), states, lengths,
            {name: t.detach().contiguous().numpy() for name, t in zip(side_names, sides)})
        ctx.program, ctx.tape = program, tape
        ctx.state_names, ctx.side_names, ctx.param_names = state_names, side_names, param_names
        ctx.given = [t is not None for t in initial]
        ctx.save_for_backward(x, *tensors)  # references, for _NoSecondDerivative
        return (torch.from_numpy(y),) + tuple(torch.from_numpy(finals[n]) for n in state_names)

    @staticmethod
    def backward(ctx, grad_y, *grad_finals):
        grads = ctx.program.backward(
            ctx.tape, grad_y.detach().contiguous().numpy(),
            {name: g.detach().contiguous().numpy()
             for name, g in zip(ctx.state_names, grad_finals)})
        # Grad mode is on in a backward only with create_graph=True.
        sources = [t for t in (*ctx.saved_tensors, grad_y, *grad_finals)
                   if t is not None and t.requires_grad] if torch.is_grad_enabled() else []

        def gradient(name):
            g = torch.from_numpy(grads[name])
            return _NoSecondDerivative.apply(g, *sources) if sources else g

        dstates = [gradient(_initial_name(n)) if given else None
                   for n, given in zip(ctx.state_names, ctx.given)]
        dsides = [gradient(n) if n in grads else None for n in ctx.side_names]
        dparams = [gradient(n) if n in grads else None for n in ctx.param_names]
        return (None, None, None, None, gradient("input"), None, *dstates, *dsides, *dparams)


def _in_type(dtype, y, finals):
    """The output and final states in `dtype` (a float64 or bfloat16 model gets its own type
    back, as from torch.nn, for the layers after it; autograd flows through the conversion)."""
    if dtype == torch.float32:
        return y, finals
    return y.to(dtype), [f.to(dtype) for f in finals]
