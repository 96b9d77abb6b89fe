"""Second derivatives through rnnc.nn's built-in modules (a gradient penalty, a Hessian-vector
product): a backward that autograd records (create_graph=True) runs the forward again in torch's
own operations and differentiates it, so the gradient has derivatives of its own. Against
torch.nn's modules of the same weights, whose CPU backward is differentiable."""

import warnings

import pytest

torch = pytest.importorskip("torch")

import rnnc.nn  # noqa: E402
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence  # noqa: E402

MODULES = [("LSTM", dict(num_layers=2, bidirectional=True), None),
           ("LSTM", dict(proj_size=3, batch_first=True), [3, 1]),
           ("GRU", dict(num_layers=2), [3, 2]),
           ("RNN", dict(nonlinearity="relu", bias=False), None),
           ("LSTMCell", {}, None), ("GRUCell", {}, None), ("RNNCell", {}, None)]


def twins(mode, options):
    torch.manual_seed(30)
    theirs = getattr(torch.nn, mode)(4, 5, **options)
    ours = getattr(rnnc.nn, mode)(4, 5, **options)
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def assert_close(got, want, what, tolerance=1e-4):
    scale = max(1e-6, float(want.abs().max()))
    error = float((got - want).abs().max()) / scale
    assert error <= tolerance, f"{what}: error {error:.3g} relative to {scale:.3g}"


class Output(torch.nn.Module):
    """A layer's output alone (rnnc.nn.Recurrent gives its final states by name too)."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return self.layer(x)[0]


def penalty_gradients(module, x, lengths, batch_first):
    """A gradient penalty's gradients: (|d sum(y^2) / dx| - 1)^2 by x and every parameter."""
    x = x.clone().requires_grad_(True)
    given = x if lengths is None else pack_padded_sequence(x, lengths, batch_first,
                                                          enforce_sorted=False)
    out = module(given)
    y = out[0] if isinstance(out, tuple) else out
    if lengths is not None:
        y = pad_packed_sequence(y, batch_first)[0]
    grad_x, = torch.autograd.grad(y.pow(2).sum(), x, create_graph=True)
    penalty = (grad_x.norm() - 1) ** 2
    return torch.autograd.grad(penalty, [x, *module.parameters()])


@pytest.mark.parametrize("mode,options,lengths", MODULES,
                         ids=[f"{m}-{o}-{l}" for m, o, l in MODULES])
def test_a_gradient_penalty_gives_torchs_second_derivatives(mode, options, lengths):
    # Was refused: "rnnc's layers give first derivatives only".
    theirs, ours = twins(mode, options)
    batch_first = options.get("batch_first", False)
    x = torch.randn(2, 4) if mode.endswith("Cell") else \
        torch.randn(2, 3, 4) if batch_first else torch.randn(3, 2, 4)
    lengths = None if lengths is None else torch.tensor(lengths)
    want = penalty_gradients(theirs, x, lengths, batch_first)
    got = penalty_gradients(ours, x, lengths, batch_first)
    names = ["x"] + [name for name, _ in theirs.named_parameters()]
    for name, g, w in zip(names, got, want):
        assert_close(g, w, f"second derivative by {name}")


def _torch_forward(mode, params, x):
    """torch's own recurrence (torch._VF) on the parameters given by name, from zero states:
    the oracle for a forward whose weights are not the module's."""
    weights = list(params.values())
    if mode == "LSTMCell":
        zero = x.new_zeros(x.shape[0], 5)
        return torch._VF.lstm_cell(x, (zero, zero), *weights)[0]
    if mode == "LSTM":  # 2 layers
        zero = x.new_zeros(2, x.shape[1], 5)
        return torch._VF.lstm(x, (zero, zero), weights, True, 2, 0.0, False, False, False)[0]
    zero = x.new_zeros(2, x.shape[1], 5)  # GRU, both directions
    return torch._VF.gru(x, zero, weights, True, 1, 0.0, False, True, False)[0]


@pytest.mark.parametrize("mode", ["LSTM", "GRU", "Recurrent", "LSTMCell"])
def test_maml_through_functional_call_gives_torchs_meta_gradients(mode):
    # Meta-learning (MAML) runs the module on fast weights, p - lr * dL/dp, through
    # torch.nn.utils.stateless.functional_call, which replaces the parameters' attributes:
    # rnnc.nn's LSTM and GRU read _flat_weights, as torch 1.13's own modules do, and ran on
    # the module's weights instead (silently: no gradient reached the fast weights).
    from torch.nn.utils.stateless import functional_call

    torch.manual_seed(40)
    module = {"LSTM": lambda: rnnc.nn.LSTM(4, 5, num_layers=2),
              "GRU": lambda: rnnc.nn.GRU(4, 5, bidirectional=True),
              "Recurrent": lambda: rnnc.nn.Recurrent("gru", bidirectional=True, input_size=4,
                                                     hidden_size=5),
              "LSTMCell": lambda: rnnc.nn.LSTMCell(4, 5)}[mode]()
    oracle = "GRU" if mode == "Recurrent" else mode
    x = torch.randn(3, 4) if mode == "LSTMCell" else torch.randn(3, 2, 4)
    results = []
    for forward in (lambda p: functional_call(module, p, (x,)),
                    lambda p: _torch_forward(oracle, p, x)):
        params = {name: p.detach().clone().requires_grad_()
                  for name, p in module.named_parameters()}
        out = forward(params)
        y = out[0] if isinstance(out, tuple) else out
        grads = torch.autograd.grad(y.pow(2).sum(), list(params.values()), create_graph=True)
        fast = {name: p - 0.1 * g for (name, p), g in zip(params.items(), grads)}
        out = forward(fast)
        y = out[0] if isinstance(out, tuple) else out
        results.append(torch.autograd.grad(y.pow(2).sum(), list(params.values())))
    for name, got, want in zip(dict(module.named_parameters()), *results):
        assert_close(got, want, f"meta-gradient by {name}")


def test_a_hessian_vector_product_of_the_parameters_is_torchs():
    theirs, ours = twins("GRU", dict(num_layers=2))
    x = torch.randn(6, 3, 4)
    products = []
    for module in (theirs, ours):
        params = list(module.parameters())
        loss = module(x)[0].pow(2).mean()
        grads = torch.autograd.grad(loss, params, create_graph=True)
        direction = [torch.ones_like(p) for p in params]
        products.append(torch.autograd.grad(grads, params, direction))
    for (name, _), got, want in zip(theirs.named_parameters(), products[1], products[0]):
        assert_close(got, want, f"Hessian-vector product, {name}")


@pytest.mark.parametrize("how", ["trace", "script"])
def test_traced_and_scripted_models_have_torchs_second_derivatives(how):
    theirs, ours = twins("LSTM", dict(num_layers=2))
    x = torch.randn(4, 2, 4)
    if how == "trace":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled = torch.jit.trace(ours, (torch.randn(3, 2, 4),))
    else:
        compiled = torch.jit.script(torch.nn.Sequential(ours))
    want = penalty_gradients(theirs, x, None, False)
    got = penalty_gradients(compiled, x, None, False)
    for g, w in zip(got, want):
        assert_close(g, w, f"{how}: second derivative")


def test_a_recurrent_built_in_cell_has_torchs_second_derivatives():
    torch.manual_seed(31)
    theirs = torch.nn.GRU(4, 5, bidirectional=True)
    ours = rnnc.nn.Recurrent("gru", bidirectional=True, input_size=4, hidden_size=5)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(3, 2, 4)

    want = penalty_gradients(theirs, x, None, False)
    got = penalty_gradients(Output(ours), x, None, False)
    for g, w in zip(got, want):
        assert_close(g, w, "Recurrent('gru'): second derivative")


GRU_NAMED_OTHERWISE = """cell renamed_gru(features, units) {
  input x[features]
  state h[units]
  param weight_ih[3*units, features], weight_hh[3*units, units]
  param bias_ih[3*units], bias_hh[3*units]
  xr, xz, xn = chunk(linear(x, weight_ih, bias_ih), 3)
  hr, hz, hn = chunk(linear(h, weight_hh, bias_hh), 3)
  r = sigmoid(xr + hr)
  z = sigmoid(xz + hz)
  h2 = (1 - z) * tanh(xn + r * hn) + z * h
  return h = h2; output h2
}"""


@pytest.mark.parametrize("lengths", [None, [3, 1]])
def test_a_custom_cell_has_the_second_derivatives_of_its_torch_twin(lengths):
    # A custom cell's forward in torch's operations is read from its IR (_torch_cell.py): this
    # one is torch's GRU under other names, stacked, both directions, packed lengths or none.
    torch.manual_seed(32)
    theirs = torch.nn.GRU(3, 4, num_layers=2, bidirectional=True)
    ours = rnnc.nn.Recurrent(GRU_NAMED_OTHERWISE, num_layers=2, bidirectional=True, features=3,
                             units=4)
    ours.load_state_dict(theirs.state_dict())
    lengths = None if lengths is None else torch.tensor(lengths)

    class Padded(torch.nn.Module):
        def __init__(self, layer, packs):
            super().__init__()
            self.layer, self.packs = layer, packs

        def forward(self, x):
            if lengths is None:
                return self.layer(x)[0]
            if not self.packs:
                return self.layer(x, lengths=lengths)[0]
            packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
            return pad_packed_sequence(self.layer(packed)[0], total_length=x.shape[0])[0]

    x = torch.randn(3, 2, 3)
    want = penalty_gradients(Padded(theirs, True), x, None, False)
    got = penalty_gradients(Padded(ours, False), x, None, False)
    for g, w in zip(got, want):
        assert_close(g, w, f"custom cell, lengths {lengths}: second derivative")


EVERY_OPERATION = """cell every_operation(input_size, hidden_size, context_size) {
  input x[input_size], ctx[context_size]
  state h[hidden_size]
  param w[hidden_size, input_size], u[hidden_size, hidden_size]
  param v[hidden_size, context_size], m[hidden_size, hidden_size]
  a = clamp(linear(x, w), -2.5, 3) + linear(h, u)
  b = layernorm(exp(min(a, 1.0)) - log(sqrt(relu(a) + 1)) / max(a, 0.5))
  p, q = chunk(cat(b, -a), 2)
  r = (h @ m) * linear(ctx, v)
  h2 = tanh(p) * sigmoid(q) + r
  return h = h2; output h2
}"""


def every_operation_by_hand(x, ctx, h, w, u, v, m):
    """The cell above written in torch, step by step: the oracle."""
    ys = []
    for t in range(x.shape[0]):
        a = torch.clamp(x[t] @ w.T, -2.5, 3) + h @ u.T
        b = torch.nn.functional.layer_norm(
            torch.exp(torch.clamp(a, max=1.0)) - torch.log(torch.sqrt(torch.relu(a) + 1))
            / torch.clamp(a, min=0.5), (a.shape[-1],), eps=1e-5)
        h = torch.tanh(b) * torch.sigmoid(-a) + (h @ m) * (ctx[t] @ v.T)
        ys.append(h)
    return torch.stack(ys)


def test_every_operation_and_a_side_input_have_second_derivatives():
    torch.manual_seed(33)
    layer = rnnc.nn.Recurrent(EVERY_OPERATION, input_size=3, hidden_size=4, context_size=2)
    x = torch.randn(5, 2, 3, requires_grad=True)
    ctx = torch.randn(5, 2, 2, requires_grad=True)
    params = [layer.w_l0, layer.u_l0, layer.v_l0, layer.m_l0]
    results = []
    for run in (lambda: every_operation_by_hand(x, ctx, x.new_zeros(2, 4), *params),
                lambda: layer(x, ctx=ctx)[0]):
        y = run()
        grad_x, grad_ctx = torch.autograd.grad(y.pow(2).sum(), [x, ctx], create_graph=True)
        penalty = grad_x.pow(2).sum() + grad_ctx.pow(2).sum()
        results.append((y.detach(),) + torch.autograd.grad(penalty, [x, ctx, *params]))
    for what, got, want in zip(["output", "x", "ctx", "w", "u", "v", "m"], results[1],
                               results[0]):
        # (float32 both, in another order: a second derivative through layernorm, exp, log
        # and a division keeps about 4 digits)
        assert_close(got, want, f"every operation: {what}", 5e-4)


def test_a_cells_dropout_in_eval_mode_is_the_identity_to_second_order():
    # (in training, the replay applies the masks drawn: test_dropout_second_derivatives.py)
    cell = """cell dropping(input_size, hidden_size) {{
      input x[input_size]
      state h[hidden_size]
      param w[hidden_size, input_size], u[hidden_size, hidden_size]
      h2 = tanh({} + linear(h, u))
      return h = h2; output h2
    }}"""
    torch.manual_seed(36)
    dropping = rnnc.nn.Recurrent(cell.format("dropout(linear(x, w), 0.3)"), input_size=3,
                                 hidden_size=4).eval()
    plain = rnnc.nn.Recurrent(cell.format("linear(x, w)"), input_size=3, hidden_size=4)
    plain.load_state_dict(dropping.state_dict())
    x = torch.randn(4, 2, 3)
    want = penalty_gradients(Output(plain), x, None, False)
    got = penalty_gradients(Output(dropping), x, None, False)
    for g, w, what in zip(got, want, ["x", "w", "u"]):
        assert_close(g, w, f"dropout in eval: second derivative by {what}", 1e-6)


@pytest.mark.parametrize("cell", ["gru", "lnlstm", "lstm", "lstm_proj", "peephole_lstm",
                                  "rnn_relu", "rnn_tanh"])
def test_the_torch_form_of_each_built_in_cell_runs_as_rnnc_does(cell):
    # What a second derivative differentiates must be the forward rnnc ran: each built-in cell's
    # IR in torch's operations (even those torch has recurrences of), 2 layers, both directions,
    # lengths, given initial states, against rnnc.nn.Recurrent's own forward.
    from rnnc._torch_cell import ir_recurrence

    sizes = dict(input_size=3, hidden_size=4, **({"proj_size": 2} if "proj" in cell else {}))
    torch.manual_seed(34)
    layer = rnnc.nn.Recurrent(cell, num_layers=2, bidirectional=True, **sizes).eval()
    x, lengths = torch.randn(5, 3, 3), [5, 2, 4]
    initial = {name: torch.randn(4, 3, width) for name, width in layer.state_sizes.items()}
    with torch.no_grad():
        want_y, want_finals = layer(x, initial, lengths=torch.tensor(lengths))
        forward = ir_recurrence(cell, sizes, "input_size", 2, True, False, lengths)
        y, finals = forward(x, list(initial.values()), [], list(layer.parameters()))
    assert_close(y, want_y, f"{cell}: output", 1e-5)
    for name, got in zip(layer.state_sizes, finals):
        assert_close(got, want_finals[name], f"{cell}: final {name}", 1e-5)


def test_a_traced_custom_cell_with_a_side_input_has_second_derivatives():
    # The trace holds rnnc::forward, whose spec names the size that is the input's width: the
    # kernel reads the cell's IR with it and replays the forward in torch's operations.
    torch.manual_seed(35)
    layer = rnnc.nn.Recurrent(EVERY_OPERATION, input_size=3, hidden_size=4, context_size=2)

    class Attending(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = layer

        def forward(self, x, ctx):
            return self.layer(x, ctx=ctx)[0]

    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(Attending(), (torch.randn(4, 2, 3), torch.randn(4, 2, 2)))
    x = torch.randn(5, 2, 3, requires_grad=True)
    ctx = torch.randn(5, 2, 2, requires_grad=True)
    params = [layer.w_l0, layer.u_l0, layer.v_l0, layer.m_l0]
    results = []
    for run in (lambda: every_operation_by_hand(x, ctx, x.new_zeros(2, 4), *params),
                lambda: traced(x, ctx)):
        grad_x, grad_ctx = torch.autograd.grad(run().pow(2).sum(), [x, ctx], create_graph=True)
        results.append(torch.autograd.grad(grad_x.pow(2).sum() + grad_ctx.pow(2).sum(),
                                           [x, ctx, *params]))
    for what, got, want in zip(["x", "ctx", "w", "u", "v", "m"], *reversed(results)):
        assert_close(got, want, f"traced: {what}", 5e-4)


def test_a_scripted_custom_cell_has_torchs_second_derivatives():
    torch.manual_seed(36)
    theirs = torch.nn.GRU(3, 4, bidirectional=True)
    ours = rnnc.nn.Recurrent(GRU_NAMED_OTHERWISE, bidirectional=True, features=3, units=4)
    ours.load_state_dict(theirs.state_dict())
    scripted = torch.jit.script(ours)

    x = torch.randn(4, 2, 3)
    want = penalty_gradients(Output(theirs), x, None, False)
    got = penalty_gradients(Output(scripted), x, None, False)
    for g, w in zip(got, want):
        assert_close(g, w, "scripted custom cell: second derivative")


def test_a_spec_saved_before_specs_named_the_input_size_still_has_second_derivatives():
    # Models saved before rnnc::forward's spec named the size that is the input's width hold
    # specs without it: the kernel reads it from the cell (was refused). torch's GRU under other
    # names, two layers (the second reads 2 * units), against torch.nn.GRU.
    import json

    torch.manual_seed(37)
    theirs = torch.nn.GRU(3, 4, num_layers=2, bidirectional=True)
    ours = rnnc.nn.Recurrent(GRU_NAMED_OTHERWISE, num_layers=2, bidirectional=True, features=3,
                             units=4)
    ours.load_state_dict(theirs.state_dict())
    names = [name for name, _ in ours._params]
    fields = json.loads(ours._spec(names))
    assert fields.pop("input_size") == "features"
    older = json.dumps(fields, sort_keys=True)

    class Older(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = ours

        def forward(self, x):
            zeros = x.new_zeros(4, x.shape[1], 4)
            return torch.ops.rnnc.forward(older, x, [zeros], None, [],
                                          list(self.layer.parameters()))[0]

    x = torch.randn(4, 2, 3)
    want = penalty_gradients(Output(theirs), x, None, False)
    got = penalty_gradients(Older(), x, None, False)
    for g, w in zip(got, want):
        assert_close(g, w, "an older spec: second derivative")


HALVES = """cell halves(half, hidden_size) {
  input x[2*half]
  state h[hidden_size]
  param w[hidden_size, 2*half], u[hidden_size, hidden_size]
  h2 = tanh(linear(x, w) + linear(h, u))
  return h = h2; output h2
}"""


def test_a_cell_whose_input_width_is_no_one_size_has_second_derivatives_everywhere():
    # x[2 * half]: no size to bind to a layer's input width. Its spec said "input_size", which a
    # traced model's kernel then bound (a ValueError in the recorded backward); it names none
    # now. The eager layer, the traced one and rnnc.Layer of the same weights agree.
    torch.manual_seed(38)
    layer = rnnc.nn.Recurrent(HALVES, half=2, hidden_size=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(Output(layer), (torch.randn(4, 2, 4),))
    plain = rnnc.Layer(HALVES)
    plain.load_state_dict(layer.state_dict())
    x = torch.randn(5, 2, 4)

    def penalty_by_x(run):
        xs = x.clone().requires_grad_(True)
        grad_x, = torch.autograd.grad(run(xs).pow(2).sum(), xs, create_graph=True)
        return torch.autograd.grad((grad_x.norm() - 1) ** 2, xs)[0]

    want = penalty_by_x(lambda x: layer(x)[0])
    for got in (penalty_by_x(traced), penalty_by_x(lambda x: plain(x)[0])):
        assert_close(got, want, "x[2 * half]: second derivative by x")
    assert want.abs().sum() > 0
    with pytest.raises(ValueError, match=r"num_layers=2: .* no one size"):
        rnnc.nn.Recurrent(HALVES, num_layers=2, half=2, hidden_size=3)


def test_a_call_with_no_torch_form_refuses_a_second_derivative_never_zero():
    # Every layer of rnnc's gives its recorded backward a forward in torch's operations; one
    # given none (recompute None) must refuse a second derivative rather than give None or 0.
    from rnnc._autograd import _Recurrence

    layer = rnnc.Layer("gru", input_size=3, hidden_size=4)
    layer.load_state_dict(torch.nn.GRU(3, 4).state_dict())
    program = layer._training_program.get(layer._build_training)
    x = torch.randn(4, 2, 3, requires_grad=True)
    h0 = torch.randn(1, 2, 4, requires_grad=True)
    y, _ = _Recurrence.apply(program, ["h"], [], [], None, None, x, None, None, h0)
    grad_x, = torch.autograd.grad(y.pow(2).sum(), x, create_graph=True)
    for wrt in (x, h0):
        with pytest.raises(NotImplementedError, match="first derivatives only"):
            torch.autograd.grad(grad_x.pow(2).sum(), wrt, retain_graph=True)


def test_a_state_nothing_differentiable_reaches_does_not_stop_a_second_derivative():
    # c decays on its own: in the recorded backward its final value has no graph, and autograd
    # refused the whole product ("element 0 of tensors does not require grad"). Found by
    # running fuzz_cells' random cells through the recorded backward.
    layer = rnnc.nn.Recurrent("""cell decaying(input_size, hidden_size) {
      input x[input_size]
      state h[hidden_size], c[hidden_size]
      param w[hidden_size, input_size]
      h2 = tanh(linear(x, w)) + 0.5 * h
      return h = h2, c = 0.5 * c; output h2
    }""", input_size=3, hidden_size=4)
    x = torch.randn(4, 2, 3, requires_grad=True)
    first = []
    for create_graph in (False, True):
        y, finals = layer(x)
        loss = y.pow(2).sum() + finals["c"].sum()
        first.append(torch.autograd.grad(loss, [x, layer.w_l0], create_graph=create_graph))
    for got, want in zip(first[1], first[0]):
        assert_close(got.detach(), want, "first derivative, recorded against rnnc's")
    second, = torch.autograd.grad(first[1][0].pow(2).sum(), layer.w_l0)
    assert second.abs().sum() > 0
