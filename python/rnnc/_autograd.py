"""rnnc's training forward and the backward it derives from the cell, as a torch.autograd.Function
(rnnc.nn's modules, and rnnc.LSTM or rnnc.Layer inside a model that trains)."""

import threading

import torch

from . import _rnnc
from ._dropout_masks import between_layers


def _initial_name(state):
    """The name the runtime gives an initial state's gradient."""
    return state + "0" if state in ("h", "c") else state


class _NoSecondDerivative(torch.autograd.Function):
    """A gradient rnnc computed, where autograd records the backward (``create_graph=True``)
    and no forward in torch's operations can be differentiated instead (see
    _Recurrence._recorded_backward), made to depend on the forward's inputs and the output
    gradients it came from, so that a second derivative through it reaches this function and is
    refused. rnnc derives first derivatives only; without this, autograd would see no path from
    the gradient back to the input and give a second derivative of None (zero with
    ``allow_unused=True``)."""

    @staticmethod
    def forward(ctx, gradient, *sources):
        return gradient.clone()

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError(
            "rnnc's layers give first derivatives only here: a second derivative (a gradient of "
            "gradients taken with create_graph=True, as a gradient penalty needs) is torch's, "
            "through the layer's forward replayed in torch's operations, which this call "
            "was given none of")


# The cells torch.nn's modules run, by rnnc's names, which are also those of torch's own
# recurrences (torch._VF.lstm, ...).
TORCH_RECURRENCES = ("lstm", "gru", "rnn_tanh", "rnn_relu")


def torch_recurrence(cell, num_layers, bidirectional, batch_first, has_biases, lengths,
                     sizes=None, input_size_name=None, drawn=None):
    """A layer's forward in torch's own operations, for a second derivative and an ONNX export:
    f(x, initial states, side inputs, parameters, products="fp32") -> (y, finals), a state given
    as None starting at zero, `lengths` (numpy, the batch's order, or None) as rnnc takes them
    (y zero past them), `products` the weights_dtype of a mixed-precision call (its products'
    operands rounded as rnnc's: _torch_cell.rounded_product). torch.nn's own recurrences for its
    cells (parameters in torch.nn's order); any other cell from its IR (_torch_cell.py) where
    its sizes are given (all of them: `input_size_name` names the input's width), else None.
    `drawn`: a training call's (seed, p between layers): its dropout masks, between layers and
    in the cell, applied as rnnc drew them (_dropout_masks.py)."""
    if cell not in TORCH_RECURRENCES:
        if sizes is None:
            return None
        from ._torch_cell import ir_recurrence

        return ir_recurrence(cell, sizes, input_size_name, num_layers, bidirectional,
                             batch_first, lengths, drawn)
    whole = _torch_nn_recurrence(getattr(torch._VF, cell), cell, bidirectional, batch_first,
                                 has_biases, lengths)

    def forward(x, initial, sides, params, products="fp32"):
        if products == "bf16":  # h rounded at each step's product: the cell's IR, step by step
            return _builtin_ir_recurrence(cell, num_layers, bidirectional, batch_first,
                                          has_biases, lengths, x, initial, params, drawn)
        if products == "fp16":  # the weights alone rounded: torch's recurrence on them
            from ._torch_cell import rounded_as

            params = [rounded_as(p, torch.float16) if p.dim() == 2 else p for p in params]
        if drawn is None or drawn[1] == 0 or num_layers == 1:
            return whole(x, initial, params, num_layers)
        # Layer by layer, each output times the mask rnnc drew between it and the next.
        slots, per_layer = 2 if bidirectional else 1, len(params) // num_layers
        finals = []
        for layer in range(num_layers):
            states = [s[layer * slots:(layer + 1) * slots] if s is not None else None
                      for s in initial]
            x, layer_finals = whole(x, states, params[layer * per_layer:(layer + 1) * per_layer],
                                    1)
            if layer + 1 < num_layers:
                x = between_layers(x, layer, drawn[1], drawn[0], batch_first)
            finals.append(layer_finals)
        return x, [torch.cat(per_state) for per_state in zip(*finals)]

    return forward


def _torch_nn_recurrence(recurrence, cell, bidirectional, batch_first, has_biases, lengths):
    """f(x, initial, params, num_layers) -> (y, finals): torch.nn's recurrence `recurrence`
    (torch._VF's lstm, gru, ...) over `num_layers` layers of parameters `params`, without
    dropout, `lengths` as torch_recurrence takes them."""

    def forward(x, initial, params, num_layers):
        batch = x.shape[0 if batch_first else 1]
        slots = num_layers * (2 if bidirectional else 1)
        states = [s if s is not None else x.new_zeros(slots, batch, width)
                  for s, width in zip(initial, _state_widths(cell, params))]
        if lengths is None:
            hx = tuple(states) if cell == "lstm" else states[0]
            y, *finals = recurrence(x, hx, list(params), has_biases, num_layers, 0.0, False,
                                    bidirectional, batch_first)
            return y, finals
        from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

        packed = pack_padded_sequence(x, torch.as_tensor(lengths), batch_first,
                                      enforce_sorted=False)
        y, finals = packed_recurrence(cell, num_layers, bidirectional, has_biases, packed,
                                      states, params)
        y, _ = pad_packed_sequence(y, batch_first, total_length=x.shape[1 if batch_first else 0])
        return y, finals

    return forward


def packed_recurrence(cell, num_layers, bidirectional, has_biases, packed, states, params):
    """torch.nn's recurrence of `cell` (one of TORCH_RECURRENCES) over a PackedSequence, as
    torch.nn's modules run one (what torch.onnx.export maps onto ONNX's operators with
    sequence_lens): the output packed alike, and the final states; `states` in the batch's
    order, one given as None starting at zero (as torch.nn's own, which export alike)."""
    from torch.nn.utils.rnn import PackedSequence

    def ordered(t, indices):
        return t if indices is None else t.index_select(1, indices)

    slots, batch = num_layers * (2 if bidirectional else 1), int(packed.batch_sizes[0])
    states = [torch.zeros(slots, batch, width, dtype=packed.data.dtype, device=packed.data.device)
              if s is None else ordered(s, packed.sorted_indices)
              for s, width in zip(states, _state_widths(cell, params))]
    hx = tuple(states) if cell == "lstm" else states[0]
    y, *finals = getattr(torch._VF, cell)(packed.data, packed.batch_sizes, hx, list(params),
                                          has_biases, num_layers, 0.0, False, bidirectional)
    return (PackedSequence(y, packed.batch_sizes, packed.sorted_indices, packed.unsorted_indices),
            [ordered(f, packed.unsorted_indices) for f in finals])


def _builtin_ir_recurrence(cell, num_layers, bidirectional, batch_first, has_biases, lengths,
                           x, initial, params, drawn=None):
    """torch.nn's cell `cell` over the sequence with bf16 products, from rnnc's built-in cell
    (cells/*.cell: lstm_proj where the LSTM has a projection), whose parameters are torch.nn's
    per layer and direction, biases included (zero where the module has none)."""
    from ._torch_cell import ir_recurrence

    weight_hh = params[1]
    gates = {"lstm": 4, "gru": 3}.get(cell, 1)
    hidden = weight_hh.shape[0] // gates
    projected = cell == "lstm" and weight_hh.shape[1] != hidden
    sizes = {"input_size": x.shape[-1], "hidden_size": hidden}
    if projected:
        sizes["proj_size"] = weight_hh.shape[1]
    per_slot = 2 + (2 if has_biases else 0) + (1 if projected else 0)
    full = []
    for start in range(0, len(params), per_slot):
        slot = params[start:start + per_slot]
        biases = slot[2:4] if has_biases else [weight_hh.new_zeros(gates * hidden)] * 2
        full += [slot[0], slot[1], *biases] + ([slot[-1]] if projected else [])
    forward = ir_recurrence("lstm_proj" if projected else cell, sizes, "input_size", num_layers,
                            bidirectional, batch_first, lengths, drawn)
    return forward(x, initial, [], full, products="bf16")


def _state_widths(cell, params):
    """h's width (weight_hh's columns: the projection's, where there is one) and c's."""
    if cell != "lstm":
        return [params[1].shape[1]]
    return [params[1].shape[1], params[1].shape[0] // 4]


class _GradientSums:
    """The parameters' gradients of a module's calls in one autograd graph, summed in place by
    rnnc's backward (_rnnc.ParameterSums) and handed on by _SummedParameters, once."""

    def __init__(self, names):
        self.names = names
        self.sums = _rnnc.ParameterSums()
        self.handed_on = False  # once a backward has run _SummedParameters: calls start anew


class _SummedParameters(torch.autograd.Function):
    """Where the parameters' gradients of a module's calls meet. A decoder stepping a cell makes
    one call per step, each with a gradient for every weight; autograd would add those up one
    call at a time into new tensors (torch 1.13 adds them out of place: an LSTMCell at H=1024
    allocates and adds 32 MB per step). Each call takes this function's output instead (a
    scalar, the token), and its backward adds its parameters' gradients into the sums, in the
    weight-gradient products themselves; this function runs after every call of the graph (it
    is their input) and gives autograd the sums as the parameters' gradients, once."""

    @staticmethod
    def forward(ctx, sums, *params):
        ctx.sums = sums
        return params[0].new_zeros(())

    @staticmethod
    def backward(ctx, _):
        sums = ctx.sums
        sums.handed_on = True
        arrays = sums.sums.take()
        return (None, *(torch.from_numpy(arrays[name]) if name in arrays else None
                        for name in sums.names))


def summed_parameters(module, names, params):
    """The token the module's call takes (see _SummedParameters) and its sums: one per module,
    thread and set of parameter tensors, until a backward hands the sums on; None where autograd
    records no gradient of a parameter (grad mode off, or none requires grad)."""
    if not torch.is_grad_enabled() or not any(p.requires_grad for p in params):
        return None
    local = module.__dict__.get("_rnnc_sums")
    if local is None:
        local = module.__dict__["_rnnc_sums"] = threading.local()
    current = getattr(local, "current", None)
    if (current is None or current[0].handed_on or len(current[1]) != len(params)
            or any(a is not b for a, b in zip(current[1], params))):
        sums = _GradientSums(list(names))
        current = local.current = (sums, tuple(params), _SummedParameters.apply(sums, *params))
    return current[0], current[2]


class _Recurrence(torch.autograd.Function):
    """y and the final states from x, the initial states, the side inputs (a cell's inputs past
    its first, by name) and the parameters, all float32. An initial state given as None starts at
    zero (and has no gradient). With `summed` (summed_parameters' result), the call also takes
    the token, and its backward adds the parameters' gradients into the sums where the graph
    this backward runs goes on to _SummedParameters (no gradient of gradients recorded). `seed`:
    the call's dropout masks' (None: the program's own), which the backward reuses."""

    @staticmethod
    def forward(ctx, program, state_names, side_names, param_names, summed, recompute, x,
                lengths, seed, *tensors):
        if summed is not None:
            tensors = tensors[1:]  # the token
        initial = tensors[:len(state_names)]
        sides = tensors[len(state_names):len(state_names) + len(side_names)]
        states = {name: t.detach().contiguous().numpy()
                  for name, t in zip(state_names, initial) if t is not None}
        y, finals, tape = program.forward(
            x.detach().contiguous().numpy(), states, lengths,
            {name: t.detach().contiguous().numpy() for name, t in zip(side_names, sides)}, seed)
        ctx.program, ctx.tape = program, tape
        ctx.state_names, ctx.side_names, ctx.param_names = state_names, side_names, param_names
        ctx.given = [t is not None for t in initial]
        ctx.sums, ctx.summing = (summed[0], summed[1].grad_fn) if summed else (None, None)
        # (a mixed-precision program's recompute rounds the products' operands as its forward)
        ctx.recompute, ctx.products = recompute, program.weights_dtype
        ctx.save_for_backward(x, *tensors)  # references, for a second derivative
        return (torch.from_numpy(y),) + tuple(torch.from_numpy(finals[n]) for n in state_names)

    @staticmethod
    def backward(ctx, grad_y, *grad_finals):
        token = [] if ctx.sums is None else [None]
        if torch.is_grad_enabled() and ctx.recompute is not None:  # create_graph=True
            return (None,) * 6 + _Recurrence._recorded_backward(ctx, grad_y, grad_finals, token)
        # Summed where _SummedParameters runs after this call in this backward (not so for
        # torch.autograd.grad with respect to the input alone) and records no graph.
        summing = (ctx.sums is not None and not torch.is_grad_enabled()
                   and torch._C._will_engine_execute_node(ctx.summing))
        grads = ctx.program.backward(
            ctx.tape, grad_y.detach().contiguous().numpy(),
            {name: g.detach().contiguous().numpy()
             for name, g in zip(ctx.state_names, grad_finals)},
            ctx.sums.sums if summing else None)
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
        token = [] if ctx.sums is None else [grad_y.new_zeros(()) if summing else None]
        return (None, None, None, None, None, None, gradient("input"), None, None, *token,
                *dstates, *dsides, *dparams)

    @staticmethod
    def _recorded_backward(ctx, grad_y, grad_finals, token):
        """The backward where autograd records it (create_graph=True, for a second derivative:
        a gradient penalty, a Hessian-vector product): the forward again in torch's own
        operations (ctx.recompute: torch_recurrence's) on the saved tensors, and its vector-
        Jacobian product, recorded, so that the gradients it gives have derivatives of their
        own. rnnc's derived backward is first order only."""
        # Fresh views of the saved tensors: the products are taken with respect to them, so
        # that they hold this call's part alone (with respect to a saved tensor itself, a
        # parameter's would also take in its paths through the earlier calls that made this
        # call's inputs, which autograd adds up besides), and they stay differentiable.
        def fresh(t):
            return t.view_as(t) if t is not None and t.requires_grad else t

        x, *tensors = [fresh(t) for t in ctx.saved_tensors]
        count = len(ctx.state_names)
        initial, sides = tensors[:count], tensors[count:count + len(ctx.side_names)]
        params = tensors[count + len(ctx.side_names):]
        wanted = [t for t in (x, *initial, *sides, *params) if t is not None and t.requires_grad]
        # Without autocast, which a gradient penalty taken inside torch.autocast would leave on
        # here: the replay rounds as the program ran (ctx.products), no more.
        with torch.enable_grad(), torch.autocast("cpu", enabled=False):
            y, finals = ctx.recompute(x, initial, sides, params, ctx.products)
            # (an output none of the wanted tensors reaches, such as a state a cell sets to a
            # constant, has no gradient to give)
            pairs = [(out, g) for out, g in zip((y, *finals), (grad_y, *grad_finals))
                     if g is not None and out.requires_grad]
            grads = iter(torch.autograd.grad([out for out, _ in pairs], wanted,
                                             [g for _, g in pairs], create_graph=True,
                                             allow_unused=True)
                         if pairs and wanted else [None] * len(wanted))

        def next_gradient(t):
            return next(grads) if t is not None and t.requires_grad else None

        dx = next_gradient(x)
        dstates = [next_gradient(t) for t in initial]
        dsides = [next_gradient(t) for t in sides]
        dparams = [next_gradient(t) for t in params]
        return (dx, None, None, *token, *dstates, *dsides, *dparams)


def _in_type(dtype, y, finals):
    """The output and final states in `dtype` (a float64 or bfloat16 model gets its own type
    back, as from torch.nn, for the layers after it; autograd flows through the conversion)."""
    if dtype == torch.float32:
        return y, finals
    return y.to(dtype), [f.to(dtype) for f in finals]
