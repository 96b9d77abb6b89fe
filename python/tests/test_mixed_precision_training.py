"""Mixed-precision training of rnnc.nn's modules (weights_dtype "bf16" or "fp16" in a call that
autograd records): the products read the weights rounded as rnnc stores them, everything else
(states, gradients, the parameters the optimiser updates) stays fp32. fp16 products multiply the
rounded weights in fp32, so the gradients are torch.nn's own on the rounded weights; bf16 products
round their other operand too, which rnnc's interpreter (jit=False) does as the JIT does."""

import pytest

torch = pytest.importorskip("torch")

import rnnc  # noqa: E402
import rnnc.nn  # noqa: E402

MODES = ["LSTM", "GRU", "RNN"]


def twins(mode, weights_dtype, jit=True, **options):
    torch.manual_seed(30)
    theirs = getattr(torch.nn, mode)(12, 16, **options)
    ours = getattr(rnnc.nn, mode)(12, 16, weights_dtype=weights_dtype, jit=jit, **options)
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def rounded(module, dtype):
    """torch.nn's module with its matrices rounded to `dtype` (kept in fp32)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() == 2:
                p.copy_(p.to(dtype).float())
    return module


def gradients(module, x, h0):
    """The output, and the gradients of the input, h0 and every parameter, of one loss."""
    x = x.clone().requires_grad_()
    h0 = h0.clone().requires_grad_()
    module.zero_grad()
    y, _ = module(x, (h0, 0.5 * h0.flip(0)) if type(module).__name__ == "LSTM" else h0)
    (y * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
    grads = {"input": x.grad, "h0": h0.grad}
    grads.update({name: p.grad for name, p in module.named_parameters()})
    return y.detach(), grads


def fp32_and_bf16_grus(seed, input_size, hidden_size):
    """rnnc.nn.GRU of 2 layers in fp32 and the same weights with weights_dtype "bf16"."""
    torch.manual_seed(seed)
    fp32 = rnnc.nn.GRU(input_size, hidden_size, num_layers=2)
    bf16 = rnnc.nn.GRU(input_size, hidden_size, num_layers=2, weights_dtype="bf16")
    bf16.load_state_dict(fp32.state_dict())
    return fp32, bf16


def worst_relative(ours, theirs):
    return max(float((ours[k] - theirs[k]).abs().max() / theirs[k].abs().max()) for k in theirs)


def inputs(bidirectional=True, layers=2):
    torch.manual_seed(31)
    return torch.randn(7, 3, 12), torch.randn(layers * (2 if bidirectional else 1), 3, 16) * 0.5


@pytest.mark.parametrize("mode", ["GRU", "RNN"])
def test_fp16_gradients_are_torch_nns_on_the_rounded_weights(mode):
    theirs, ours = twins(mode, "fp16", num_layers=2, bidirectional=True)
    x, h0 = inputs()
    y_ours, ours_grads = gradients(ours, x, h0)
    y_theirs, theirs_grads = gradients(rounded(theirs, torch.float16), x, h0)
    assert torch.allclose(y_ours, y_theirs, atol=1e-5)
    assert worst_relative(ours_grads, theirs_grads) < 1e-4
    # The rounding is visible: torch.nn's gradients on the weights as given differ.
    _, fp32_grads = gradients(twins(mode, "fp32", num_layers=2, bidirectional=True)[0], x, h0)
    assert worst_relative(ours_grads, fp32_grads) > 5e-5


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("mode", MODES)
def test_the_jit_matches_the_interpreter_which_rounds_as_it_does(mode, dtype):
    _, jit = twins(mode, dtype, num_layers=2, bidirectional=True)
    _, interpreted = twins(mode, dtype, jit=False, num_layers=2, bidirectional=True)
    x, h0 = inputs()
    y_jit, jit_grads = gradients(jit, x, h0)
    y_interpreted, interpreted_grads = gradients(interpreted, x, h0)
    # bf16 rounds the products' inputs: where the two sum a value in another order, its rounding
    # may tip by one bf16 step (2^-8 relative), and what follows with it.
    output_bound, gradient_bound = (1e-5, 1e-4) if dtype == "fp16" else (1e-3, 2e-3)
    assert torch.allclose(y_jit, y_interpreted, atol=output_bound)
    assert worst_relative(jit_grads, interpreted_grads) < gradient_bound


def test_lstm_bf16_gradients_stay_within_1e2_of_fp32_on_the_rounded_weights():
    theirs, ours = twins("LSTM", "bf16", num_layers=2, bidirectional=True)
    x, h0 = inputs()
    c0 = torch.zeros_like(h0)
    ours_y, _ = ours(x, (h0, c0))
    theirs_y, _ = rounded(theirs, torch.bfloat16)(x, (h0, c0))
    assert float((ours_y - theirs_y).abs().max()) < 1e-2
    (ours_y.pow(2).sum()).backward()
    (theirs_y.pow(2).sum()).backward()
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
        error = float((p.grad - q.grad).norm() / q.grad.norm())
        assert error < 1e-2, f"{name}: {error:.3g}"


def test_the_forward_in_training_is_the_inference_forward():
    _, ours = twins("LSTM", "bf16", num_layers=2)
    x = torch.randn(9, 4, 12, requires_grad=True)
    y, (h, c) = ours(x)
    with torch.no_grad():
        y_inference, (h_inference, c_inference) = ours(x)
    assert torch.allclose(y, y_inference, atol=1e-6)
    assert torch.allclose(c, c_inference, atol=1e-6)


def test_an_optimiser_trains_the_fp32_parameters():
    torch.manual_seed(32)
    model = rnnc.nn.GRU(4, 24, weights_dtype="bf16")
    head = torch.nn.Linear(24, 1)
    optimiser = torch.optim.Adam([*model.parameters(), *head.parameters()], lr=1e-2)
    x = torch.randn(12, 16, 4)
    target = x.sum(dim=(0, 2)).unsqueeze(1) * 0.1  # the sum of everything seen
    losses = []
    for _ in range(40):
        optimiser.zero_grad()
        y, _ = model(x)
        loss = torch.nn.functional.mse_loss(head(y[-1]), target)
        loss.backward()
        optimiser.step()
        losses.append(float(loss))
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert losses[-1] < 0.3 * losses[0], losses


SECOND_ORDER = [("LSTM", dict(num_layers=2, bidirectional=True), None),
                ("LSTM", dict(proj_size=5, batch_first=True), [4, 2, 3]),
                ("GRU", dict(num_layers=2), [4, 1, 3]),
                ("RNN", dict(nonlinearity="relu", bias=False), None),
                ("LSTMCell", {}, None), ("GRUCell", {}, None)]
SECOND_ORDER_IDS = [f"{m}-{o}-{l}" for m, o, l in SECOND_ORDER]


def second_order_inputs(mode, options):
    torch.manual_seed(36)
    if mode.endswith("Cell"):
        return torch.randn(3, 12)
    return torch.randn(3, 4, 12) if options.get("batch_first") else torch.randn(4, 3, 12)


def second_order_case(mode, options, weights_dtype):
    """torch.nn's module and rnnc.nn's twin in `weights_dtype`, an input, whether it is batch
    first, and the names of what a penalty's gradients are taken by (x, then the parameters)."""
    theirs, ours = twins(mode, weights_dtype, **options)
    names = ["x"] + [name for name, _ in theirs.named_parameters()]
    return theirs, ours, second_order_inputs(mode, options), options.get("batch_first", False), \
        names


def penalised(module, x, lengths, batch_first, create_graph=True):
    """The gradient of sum(y^2) by x (recorded with create_graph), and a penalty's gradients
    by x and every parameter (None without create_graph); y is the module's output, or the
    first of what it returns (torch.nn's modules and rnnc.nn.Recurrent give a tuple)."""
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    x = x.clone().requires_grad_(True)
    given = x if lengths is None else pack_padded_sequence(x, torch.tensor(lengths), batch_first,
                                                          enforce_sorted=False)
    out = module(given)
    y = out[0] if isinstance(out, tuple) else out
    if lengths is not None:
        y = pad_packed_sequence(y, batch_first)[0]
    params = list(module.parameters())
    grads = torch.autograd.grad(y.pow(2).sum(), [x, *params], create_graph=create_graph)
    if not create_graph:
        return grads, None
    penalty = (grads[0].norm() - 1) ** 2 + sum(g.pow(2).sum() for g in grads[1:]) * 1e-2
    return grads, torch.autograd.grad(penalty, [x, *params])


def relative(got, want):
    return float((got - want).abs().max()) / max(1e-6, float(want.abs().max()))


def relative_norm(got, want):
    return float((got - want).norm()) / max(1e-6, float(want.norm()))


@pytest.mark.parametrize("mode,options,lengths", SECOND_ORDER, ids=SECOND_ORDER_IDS)
def test_fp16_second_derivatives_are_torch_nns_on_the_rounded_weights(mode, options, lengths):
    # Was refused ("rnnc's layers give first derivatives only here ... mixed precision"). The
    # recorded backward replays the forward in torch's operations with its products' weights
    # rounded, differentiating through the rounding as the identity: torch.nn's own second
    # derivatives at the rounded weights.
    theirs, ours, x, batch_first, names = second_order_case(mode, options, "fp16")
    ours_first, ours_second = penalised(ours, x, lengths, batch_first)
    theirs_first, theirs_second = penalised(rounded(theirs, torch.float16), x, lengths,
                                            batch_first)
    for name, got, want in zip(names, ours_first + ours_second, theirs_first + theirs_second):
        assert relative(got, want) < 1e-4, name
    # and they are not those of the weights as given
    _, fp32_second = penalised(twins(mode, "fp32", **options)[0], x, lengths, batch_first)
    assert max(relative(g, w) for g, w in zip(ours_second, fp32_second)) > 1e-4


@pytest.mark.parametrize("mode,options,lengths", SECOND_ORDER, ids=SECOND_ORDER_IDS)
def test_bf16_recorded_gradients_are_rnncs_own_and_near_fp32s(mode, options, lengths):
    # bf16 rounds each product's other operand (x, h, a projection's input) too, which no
    # torch.nn recurrence does: the replay steps rnnc's built-in cell (cells/*.cell) in torch's
    # operations, rounding as the interpreter. Its first derivatives must be those rnnc's own
    # backward gives (the forward that ran), its second derivatives near fp32's.
    theirs, ours, x, batch_first, names = second_order_case(mode, options, "bf16")
    recorded, second = penalised(ours, x, lengths, batch_first)
    derived, _ = penalised(ours, x, lengths, batch_first, create_graph=False)
    for name, got, want in zip(names, recorded, derived):
        # (rnnc's gradient products round their operands to bf16 too: 2^-8 a term; the forward
        # itself is the same to 1e-5: test_a_modules_mixed_precision_replay_is_its_forward)
        assert relative(got, want) < 5e-3, f"first derivative by {name}"
    _, fp32_second = penalised(rounded(theirs, torch.bfloat16), x, lengths, batch_first)
    for name, got, want in zip(names, second, fp32_second):
        error = relative_norm(got, want)  # (an LSTMCell from zero states: weight_hh's is zero)
        assert error < 1.5e-2, f"second derivative by {name}: {error:.3g}"


def test_a_gradient_penalty_inside_autocast_is_the_bf16_modules_outside():
    # Under torch.autocast an fp32 module runs as bf16 (rnnc/_programs.py), and a penalty taken
    # inside it left autocast on in the replay: its linears gave bf16 results (0.6% off).
    fp32, bf16 = fp32_and_bf16_grus(39, 4, 5)
    x = torch.randn(3, 2, 4)
    results = []
    for module, autocast in ((fp32, True), (bf16, False)):
        given = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            y, _ = module(given)
            (grad,) = torch.autograd.grad(y.pow(2).sum(), given, create_graph=True)
            penalty = (grad.norm() - 1) ** 2
        results.append([grad, *torch.autograd.grad(penalty, [given, *module.parameters()])])
    for got, want in zip(*results):
        assert torch.equal(got, want)


@pytest.mark.parametrize("cell", ["gru", "lnlstm", "lstm", "lstm_proj", "rnn_relu"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_the_torch_form_in_mixed_precision_runs_as_rnncs_interpreter(cell, dtype):
    # What a mixed-precision second derivative differentiates must be the forward rnnc ran:
    # each cell's IR in torch's operations with its products rounded, 2 layers, both
    # directions, lengths, against rnnc's interpreter (jit=False), which rounds alike.
    from rnnc._torch_cell import ir_recurrence

    sizes = dict(input_size=3, hidden_size=4, **({"proj_size": 2} if "proj" in cell else {}))
    torch.manual_seed(37)
    layer = rnnc.nn.Recurrent(cell, num_layers=2, bidirectional=True, jit=False,
                              weights_dtype=dtype, **sizes)
    x, lengths = torch.randn(5, 3, 3), [5, 2, 4]
    with torch.no_grad():
        want_y, _ = layer(x, lengths=torch.tensor(lengths))
        forward = ir_recurrence(cell, sizes, "input_size", 2, True, False, lengths)
        y, _ = forward(x, [None] * len(layer.state_sizes), [], list(layer.parameters()),
                       products=dtype)
        fp32_y, _ = forward(x, [None] * len(layer.state_sizes), [], list(layer.parameters()))
    assert relative(y, want_y) < 1e-5
    assert relative(fp32_y, want_y) > (2e-5 if dtype == "fp16" else 5e-4)  # the rounding shows


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("mode,options,lengths", SECOND_ORDER[:4], ids=SECOND_ORDER_IDS[:4])
def test_a_modules_mixed_precision_replay_is_its_forward(mode, options, lengths, dtype):
    # torch.nn's modules replay through torch's recurrence on rounded weights (fp16) or rnnc's
    # built-in cell stepped in torch's operations (bf16: lstm_proj for a projection, zero
    # biases where the module has none), against the module's own forward by the interpreter.
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    from rnnc._autograd import torch_recurrence

    _, ours = twins(mode, dtype, jit=False, **options)
    x = second_order_inputs(mode, options)
    batch_first = options.get("batch_first", False)
    with torch.no_grad():
        if lengths is None:
            want, _ = ours(x)
        else:
            packed = pack_padded_sequence(x, torch.tensor(lengths), batch_first,
                                          enforce_sorted=False)
            want = pad_packed_sequence(ours(packed)[0], batch_first)[0]
        forward = torch_recurrence(ours._rnnc_cell(), ours.num_layers, ours.bidirectional,
                                   batch_first, ours.bias, lengths)
        states = [None] * (2 if mode == "LSTM" else 1)
        y, _ = forward(x, states, [], list(ours._flat_weights), dtype)
        fp32_y, _ = forward(x, states, [], list(ours._flat_weights))
    assert relative(y, want) < 1e-5
    assert relative(fp32_y, want) > (2e-5 if dtype == "fp16" else 5e-4)


WEIGHT_OF_PARAMETERS = """cell mixed(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w[hidden_size, input_size], a[hidden_size, hidden_size], b[hidden_size, hidden_size]
  u = a + b
  h2 = tanh(x @ w^T + h @ u)
  return h = h2; output h2
}"""


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_a_custom_cells_mixed_precision_second_derivatives(dtype):
    # A weight made of parameters (u = a + b) is rounded where the product reads it, and a
    # derivative goes on through it to both parameters.
    torch.manual_seed(38)
    layer = rnnc.nn.Recurrent(WEIGHT_OF_PARAMETERS, num_layers=2, input_size=3, hidden_size=4,
                              weights_dtype=dtype)
    x = torch.randn(6, 2, 3)
    recorded, second = penalised(layer, x, None, False)
    derived, _ = penalised(layer, x, None, False, create_graph=False)
    for got, want in zip(recorded, derived):
        assert relative(got, want) < (1e-4 if dtype == "fp16" else 1e-2)
    fp32 = rnnc.nn.Recurrent(WEIGHT_OF_PARAMETERS, num_layers=2, input_size=3, hidden_size=4)
    fp32.load_state_dict(layer.state_dict())
    _, fp32_second = penalised(fp32, x, None, False)
    for got, want in zip(second, fp32_second):
        assert relative_norm(got, want) < 3e-2


def test_rnnc_layers_give_input_gradients_in_mixed_precision():
    theirs, _ = twins("LSTM", "fp32")
    layer = rnnc.from_torch(theirs, weights_dtype="fp16")
    x = torch.randn(6, 2, 12, requires_grad=True)
    y, _ = layer(x)
    y.sum().backward()
    x2 = x.detach().clone().requires_grad_()
    rounded(theirs, torch.float16)(x2)[0].sum().backward()
    assert torch.allclose(x.grad, x2.grad, atol=1e-5)


def test_autocast_bf16_runs_an_fp32_module_in_mixed_precision():
    module, mixed = fp32_and_bf16_grus(33, 12, 16)
    x = torch.randn(6, 3, 12)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, _ = module(x)
        with torch.autocast("cpu", enabled=False):
            y_fp32, _ = module(x)
    assert module.weights_dtype == "fp32"  # the option itself is unchanged
    y_mixed, _ = mixed(x)
    assert y.dtype == torch.float32  # the input's type, as torch.nn's LSTM keeps it
    assert torch.equal(y, y_mixed)
    assert torch.equal(y_fp32, module(x)[0])
    assert not torch.equal(y, y_fp32)
    # Its gradients are mixed precision's.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        module(x)[0].sum().backward()
    mixed(x)[0].sum().backward()
    for p, q in zip(module.parameters(), mixed.parameters()):
        assert torch.equal(p.grad, q.grad)


MGU_WITH_CONTEXT = """cell mgu(input_size, hidden_size, context_size) {
  input x[input_size]
  input context[context_size]
  state h[hidden_size]
  param weight_f[hidden_size, input_size], weight_uf[hidden_size, hidden_size]
  param weight_c[hidden_size, context_size], bias_f[hidden_size]
  param weight_h[hidden_size, input_size], weight_uh[hidden_size, hidden_size]
  f = sigmoid(linear(x, weight_f, bias_f) + linear(h, weight_uf) + linear(context, weight_c))
  candidate = tanh(linear(x, weight_h) + linear(f * h, weight_uh))
  h2 = (1 - f) * h + f * candidate
  return h = h2; output h2
}"""


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_a_custom_cell_with_a_side_input_trains_in_mixed_precision(dtype):
    """rnnc.nn.Recurrent: the JIT's gradients (parameters, input, side input, h0) are the
    interpreter's, which rounds its products alike."""
    results = []
    for jit in (True, False):
        torch.manual_seed(34)
        model = rnnc.nn.Recurrent(MGU_WITH_CONTEXT, num_layers=2, bidirectional=True, jit=jit,
                                  weights_dtype=dtype, input_size=6, hidden_size=10,
                                  context_size=4)
        torch.manual_seed(35)
        x = torch.randn(5, 3, 6, requires_grad=True)
        context = torch.randn(5, 3, 4, requires_grad=True)
        h0 = torch.randn(4, 3, 10, requires_grad=True)
        y, finals = model(x, {"h": h0}, context=context)
        (y.sum() + finals["h"].pow(2).sum()).backward()
        grads = {"input": x.grad, "context": context.grad, "h0": h0.grad}
        grads.update({name: p.grad for name, p in model.named_parameters()})
        results.append((y.detach(), grads))
    (y_jit, jit_grads), (y_interpreted, interpreted_grads) = results
    assert torch.allclose(y_jit, y_interpreted, atol=1e-5 if dtype == "fp16" else 1e-3)
    assert worst_relative(jit_grads, interpreted_grads) < (1e-4 if dtype == "fp16" else 2e-3)
