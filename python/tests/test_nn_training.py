"""rnnc.nn: torch modules whose forward and backward are rnnc's, against torch autograd and
torch.autograd.gradcheck."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import rnnc  # noqa: E402
import rnnc.nn  # noqa: E402
from dropout_definition import dropout_mask  # noqa: E402
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence  # noqa: E402


def twins(mode, *args, **kwargs):
    """A torch.nn module and rnnc's, with the same weights."""
    torch.manual_seed(11)
    theirs = getattr(torch.nn, mode)(*args, **kwargs)
    ours = getattr(rnnc.nn, mode)(*args, **kwargs)
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def run_and_backward(module, x, hx, weights):
    """Output, final states and every gradient for a loss that weighs every output."""
    x = x.clone().requires_grad_()
    hx = None if hx is None else tuple(h.clone().requires_grad_() for h in hx)
    call_hx = hx if hx is None or len(hx) == 2 else hx[0]
    y, final = module(x, call_hx)
    finals = final if isinstance(final, tuple) else (final,)
    data = y.data if isinstance(y, torch.nn.utils.rnn.PackedSequence) else y
    loss = (data * weights[0]).sum() + sum((f * w).sum() for f, w in zip(finals, weights[1:]))
    module.zero_grad()
    loss.backward()
    grads = {name: p.grad.clone() for name, p in module.named_parameters()}
    grads["input"] = x.grad
    for i, h in enumerate(hx or ()):
        grads[f"hx{i}"] = h.grad
    return data.detach(), [f.detach() for f in finals], grads


def assert_close(ours, theirs, what, tolerance=1e-4):
    scale = max(1e-6, float(theirs.abs().max()))
    error = float((ours - theirs).abs().max()) / scale
    assert error <= tolerance, f"{what}: max error {error:.3g} relative to {scale:.3g}"


CASES = [("LSTM", dict()), ("LSTM", dict(num_layers=2, bidirectional=True)),
         ("LSTM", dict(proj_size=3, batch_first=True)), ("GRU", dict(num_layers=2)),
         ("GRU", dict(bidirectional=True, bias=False)), ("RNN", dict(nonlinearity="relu")),
         ("RNN", dict(num_layers=2, batch_first=True))]


@pytest.mark.parametrize("mode,options", CASES, ids=[f"{m}-{o}" for m, o in CASES])
def test_gradients_match_torch_autograd(mode, options):
    theirs, ours = twins(mode, 4, 5, **options)
    batch_first = options.get("batch_first", False)
    x = torch.randn(3, 6, 4) if batch_first else torch.randn(6, 3, 4)
    slots = (2 if options.get("bidirectional") else 1) * options.get("num_layers", 1)
    h = torch.randn(slots, 3, options.get("proj_size") or 5)
    hx = (h, torch.randn(slots, 3, 5)) if mode == "LSTM" else (h,)
    y_shape = theirs(x)[0].shape
    weights = [torch.randn(y_shape)] + [torch.randn(s.shape) for s in hx]
    for given in [None, hx]:
        want = run_and_backward(theirs, x, given, weights)
        got = run_and_backward(ours, x, given, weights)
        assert_close(got[0], want[0], "output")
        for i, (a, b) in enumerate(zip(got[1], want[1])):
            assert_close(a, b, f"final state {i}")
        assert set(got[2]) == set(want[2])
        for name in want[2]:
            assert_close(got[2][name], want[2][name], f"gradient of {name}")


def test_packed_sequence_gradients_match_torch():
    theirs, ours = twins("LSTM", 3, 4, bidirectional=True)
    lengths = torch.tensor([2, 5, 3])
    padded = torch.randn(5, 3, 3)
    weights_y = torch.randn(int(lengths.sum()), 8)
    results = []
    for module in (theirs, ours):
        x = padded.clone().requires_grad_()
        packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
        y, (h, c) = module(packed)
        ((y.data * weights_y).sum() + h.sum() + c.sum()).backward()
        results.append((y.data.detach(), x.grad, module.weight_hh_l0_reverse.grad))
    for got, want, what in zip(results[1], results[0], ["output", "input grad", "W_hh grad"]):
        assert_close(got, want, what)


def test_gradcheck_on_a_small_lstm():
    torch.manual_seed(5)
    module = rnnc.nn.LSTM(2, 3, num_layers=2)
    x = torch.randn(4, 2, 2, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(2, 2, 3, dtype=torch.float64, requires_grad=True)
    c0 = torch.randn(2, 2, 3, dtype=torch.float64, requires_grad=True)

    def f(x, h0, c0):
        y, (h, c) = module(x, (h0, c0))
        return y.double(), h.double(), c.double()

    # rnnc computes in float32: central differences with a step float32 resolves.
    assert torch.autograd.gradcheck(f, (x, h0, c0), eps=1e-3, atol=2e-3, rtol=1e-2)


def test_an_optimiser_trains_it():
    torch.manual_seed(0)
    model = rnnc.nn.GRU(2, 8)
    head = torch.nn.Linear(8, 1)
    optimiser = torch.optim.Adam(list(model.parameters()) + list(head.parameters()), lr=0.03)
    x = torch.randn(10, 16, 2)
    target = x[:, :, :1].sum(0)  # the sum of the first feature over time
    losses = []
    for _ in range(60):
        y, _ = model(x)
        loss = ((head(y[-1]) - target) ** 2).mean()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        losses.append(float(loss))
    assert losses[-1] < 0.2 * losses[0], losses[::10]


def test_dropout_between_layers_in_training_draws_new_masks():
    torch.manual_seed(2)
    model = rnnc.nn.LSTM(3, 16, num_layers=2, dropout=0.5)
    x = torch.randn(5, 2, 3)
    first, second = model(x)[0], model(x)[0]
    assert not torch.equal(first, second)
    model.eval()
    assert torch.equal(model(x)[0], model(x)[0])


# ---- rnnc.nn.Recurrent: any cell, dropout inside it --------------------------------------------

DROPPING_CELL = """cell dropping(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w[hidden_size, input_size], u[hidden_size, hidden_size], b[hidden_size]
  h2 = tanh(linear(dropout(x, 0.25), w, b) + linear(dropout(h, 0.5), u))
  return h = h2; output h2
}"""


def test_a_custom_cell_with_dropout_trains_with_the_forwards_masks():
    torch.manual_seed(3)
    steps, batch, inputs, hidden, seed = 5, 3, 4, 6, 12345
    model = rnnc.nn.Recurrent(DROPPING_CELL, input_size=inputs, hidden_size=hidden)
    assert sorted(name for name, _ in model.named_parameters()) == ["b_l0", "u_l0", "w_l0"]
    x = torch.randn(steps, batch, inputs, requires_grad=True)
    h0 = torch.randn(1, batch, hidden, requires_grad=True)
    dy = torch.randn(steps, batch, hidden)
    y, finals = model(x, {"h": h0}, seed=seed)
    (y * dy).sum().backward()

    # The same cell by hand in float64, with the masks drawn from their definition: step t's
    # rows are t * B + b, the first layer's seed is the call's.
    w, u, b = (p.detach().double().requires_grad_() for p in (model.w_l0, model.u_l0, model.b_l0))
    xd, hd = x.detach().double().requires_grad_(), h0.detach().double().requires_grad_()
    h, outputs = hd[0], []
    for t in range(steps):
        rows = [t * batch + r for r in range(batch)]
        mx, mh = dropout_mask(seed, 0, rows, inputs, 0.25), dropout_mask(seed, 1, rows, hidden, 0.5)
        h = torch.tanh((xd[t] * mx) @ w.T + b + (h * mh) @ u.T)
        outputs.append(h)
    expected = torch.stack(outputs)
    (expected * dy.double()).sum().backward()
    assert_close(y.detach().double(), expected.detach(), "output")
    assert_close(finals["h"][0].detach().double(), h.detach(), "final h")
    for ours, theirs, what in [(model.w_l0.grad, w.grad, "w"), (model.u_l0.grad, u.grad, "u"),
                               (model.b_l0.grad, b.grad, "b"), (x.grad, xd.grad, "input"),
                               (h0.grad, hd.grad, "h0")]:
        assert_close(ours.double(), theirs, what)
    # The input reaches the loss only through its dropout: zero gradient where it was dropped.
    assert 0.1 < float((x.grad == 0).double().mean()) < 0.4


WEIGHT_DROP_CELL = """cell weightdrop(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w[hidden_size, input_size], u[hidden_size, hidden_size], b[hidden_size]
  h2 = tanh(linear(x, w, b) + linear(h, dropout(u, 0.5)))
  return h = h2; output h2
}"""


def test_a_weights_dropout_is_one_mask_per_call_and_trains():
    # AWD-LSTM's weight drop: the recurrent weight times one mask for the whole call (row r of
    # u, the dropout's stream 0, the call's seed), the same at every step and for every row.
    torch.manual_seed(5)
    steps, batch, inputs, hidden, seed = 4, 3, 3, 5, 777
    model = rnnc.nn.Recurrent(WEIGHT_DROP_CELL, input_size=inputs, hidden_size=hidden)
    x = torch.randn(steps, batch, inputs, requires_grad=True)
    dy = torch.randn(steps, batch, hidden)
    y, finals = model(x, seed=seed)
    (y * dy).sum().backward()

    w, u, b = (p.detach().double().requires_grad_() for p in (model.w_l0, model.u_l0, model.b_l0))
    xd = x.detach().double().requires_grad_()
    mask = dropout_mask(seed, 0, range(hidden), hidden, 0.5)
    h, outputs = torch.zeros(batch, hidden, dtype=torch.float64), []
    for t in range(steps):
        h = torch.tanh(xd[t] @ w.T + b + h @ (u * mask).T)
        outputs.append(h)
    expected = torch.stack(outputs)
    (expected * dy.double()).sum().backward()
    assert_close(y.detach().double(), expected.detach(), "output")
    for ours, theirs, what in [(model.w_l0.grad, w.grad, "w"), (model.u_l0.grad, u.grad, "u"),
                               (model.b_l0.grad, b.grad, "b"), (x.grad, xd.grad, "input")]:
        assert_close(ours.double(), theirs, what)
    assert bool((model.u_l0.grad[mask == 0] == 0).all()), "no gradient where u was dropped"
    assert not torch.equal(y, model(x, seed=seed + 1)[0]), "another call, another mask"
    # In eval mode the dropout is the identity, and the weight's gradient goes straight through.
    model.eval()
    model.zero_grad()
    y, _ = model(x.detach())
    (y * dy).sum().backward()
    h, outputs = torch.zeros(batch, hidden, dtype=torch.float64), []
    w, u, b = (p.detach().double().requires_grad_() for p in (model.w_l0, model.u_l0, model.b_l0))
    for t in range(steps):
        h = torch.tanh(xd[t].detach() @ w.T + b + h @ u.T)
        outputs.append(h)
    (torch.stack(outputs) * dy.double()).sum().backward()
    assert_close(y.detach().double(), torch.stack(outputs).detach(), "eval output")
    assert_close(model.u_l0.grad.double(), u.grad, "eval u")


def test_a_custom_cells_dropout_draws_new_masks_in_training_only():
    torch.manual_seed(4)
    model = rnnc.nn.Recurrent(DROPPING_CELL, num_layers=2, bidirectional=True, input_size=3,
                              hidden_size=5)
    assert model.w_l1.shape == (5, 10)  # layer 1 reads both directions of layer 0
    x = torch.randn(6, 2, 3)
    first, second = model(x)[0], model(x)[0]
    assert not torch.equal(first, second)
    assert torch.equal(model(x, seed=9)[0], model(x, seed=9)[0])
    model.eval()
    inference = rnnc.Layer(DROPPING_CELL, num_layers=2, bidirectional=True)
    inference.load_state_dict({name: p.detach() for name, p in model.named_parameters()})
    assert torch.equal(model(x)[0], model(x)[0])
    assert_close(model(x)[0].detach(), inference(x)[0], "eval mode against rnnc.Layer", 1e-6)


def test_a_builtin_cell_as_recurrent_trains_as_torch_does_packed_too():
    torch.manual_seed(6)
    theirs = torch.nn.GRU(3, 5, bidirectional=True)
    ours = rnnc.nn.Recurrent("gru", bidirectional=True, input_size=3, hidden_size=5)
    ours.load_state_dict(theirs.state_dict())
    lengths = torch.tensor([4, 2, 3])
    padded = torch.randn(4, 3, 3)
    weights_y = torch.randn(int(lengths.sum()), 10)
    results = []
    for module in (theirs, ours):
        x = padded.clone().requires_grad_()
        y, h = module(pack_padded_sequence(x, lengths, enforce_sorted=False))
        h = h if isinstance(h, torch.Tensor) else h["h"]
        ((y.data * weights_y).sum() + h.sum()).backward()
        results.append((y.data.detach(), x.grad, module.weight_hh_l0_reverse.grad))
    for got, want, what in zip(results[1], results[0], ["output", "input grad", "W_hh grad"]):
        assert_close(got, want, what)


def test_recurrent_refuses_a_state_the_cell_does_not_have():
    model = rnnc.nn.Recurrent(DROPPING_CELL, input_size=2, hidden_size=3)
    with pytest.raises(ValueError, match="no state c"):
        model(torch.randn(2, 1, 2), {"c": torch.zeros(1, 1, 3)})


# ---- calls autograd does not record: one inference program while the weights stay ---------------

def test_evaluation_under_no_grad_reuses_one_program_and_sees_every_weight_change():
    """Under torch.no_grad() in eval mode the module runs rnnc's inference program, kept between
    calls; whatever changes a weight (an optimiser step, load_state_dict, a write through .data
    that torch's version counter does not see) gives torch's result for the new weights."""
    theirs, ours = twins("LSTM", 4, 6, num_layers=2, bidirectional=True)
    theirs.eval(), ours.eval()
    x = torch.randn(5, 3, 4)

    def check(what):
        with torch.no_grad():
            got, want = ours(x), theirs(x)
        assert_close(got[0], want[0], f"{what}: output", 1e-5)
        assert_close(got[1][1], want[1][1], f"{what}: c_n", 1e-5)
        return ours.__dict__["_rnnc_inference"][-1]

    program = check("first call")
    assert check("second call") is program, "the second call built another program"
    optimiser = torch.optim.SGD(ours.parameters(), lr=0.5)
    ours(x)[0].sum().backward()
    optimiser.step()
    theirs.load_state_dict(ours.state_dict())
    assert check("after an optimiser step") is not program
    ours.weight_hh_l1_reverse.data.mul_(0.5)  # not counted by torch's version counter
    theirs.weight_hh_l1_reverse.data.mul_(0.5)
    check("after a write through .data")
    state = {name: value * -1 for name, value in theirs.state_dict().items()}
    ours.load_state_dict(state), theirs.load_state_dict(state)
    check("after load_state_dict")


def test_a_module_that_ran_inference_still_copies():
    import copy
    import pickle

    theirs, ours = twins("GRU", 3, 4)
    x = torch.randn(4, 2, 3)
    with torch.no_grad():
        want = ours.eval()(x)[0]
    for twin in (copy.deepcopy(ours), pickle.loads(pickle.dumps(ours))):
        with torch.no_grad():
            assert torch.equal(twin(x)[0], want)


def test_inference_calls_keep_trainings_semantics_where_they_differ():
    """Under no_grad a module in training mode still draws dropout masks (between layers, and a
    custom cell's), and a module that autograd records still gives gradients."""
    torch.manual_seed(8)
    stacked = rnnc.nn.LSTM(3, 16, num_layers=2, dropout=0.5)
    x = torch.randn(5, 2, 3)
    with torch.no_grad():
        assert not torch.equal(stacked(x)[0], stacked(x)[0])
    cell = rnnc.nn.Recurrent(DROPPING_CELL, input_size=3, hidden_size=4)
    with torch.no_grad():
        assert not torch.equal(cell(x)[0], cell(x)[0])
        cell.eval()
        assert torch.equal(cell(x)[0], cell(x)[0])
    y, _ = cell(x)  # eval mode, grad enabled: the parameters require grad
    y.sum().backward()
    assert cell.w_l0.grad is not None and float(cell.w_l0.grad.abs().sum()) > 0


def test_a_custom_cells_evaluation_matches_torch():
    torch.manual_seed(9)
    theirs = torch.nn.GRU(3, 5, num_layers=2).eval()
    ours = rnnc.nn.Recurrent("gru", num_layers=2, input_size=3, hidden_size=5).eval()
    ours.load_state_dict(theirs.state_dict())
    x, h0 = torch.randn(6, 2, 3), torch.randn(2, 2, 5)
    with torch.no_grad():
        y, finals = ours(x, {"h": h0})
        want_y, want_h = theirs(x, h0)
    assert_close(y, want_y, "output", 1e-5)
    assert_close(finals["h"], want_h, "h_n", 1e-5)
    assert ours.__dict__["_rnnc_inference"] is not None


EVAL_CASES = [("LSTM", dict(proj_size=3, batch_first=True)), ("GRU", dict(bidirectional=True)),
              ("RNN", dict(nonlinearity="relu", num_layers=2, dropout=0.5))]


@pytest.mark.parametrize("mode,options", EVAL_CASES, ids=[f"{m}-{o}" for m, o in EVAL_CASES])
def test_evaluation_matches_torch_padded_and_packed(mode, options):
    theirs, ours = twins(mode, 4, 5, **options)
    theirs.eval(), ours.eval()
    batch_first = options.get("batch_first", False)
    x = torch.randn(3, 6, 4) if batch_first else torch.randn(6, 3, 4)
    lengths = torch.tensor([6, 2, 5])
    packed = pack_padded_sequence(x, lengths, batch_first=batch_first, enforce_sorted=False)
    with torch.no_grad():
        for given in (x, packed):
            got, want = ours(given), theirs(given)
            got_y, want_y = (got[0].data, want[0].data) if given is packed else (got[0], want[0])
            assert_close(got_y, want_y, f"{mode} output", 1e-5)
            got_h = got[1][0] if mode == "LSTM" else got[1]
            want_h = want[1][0] if mode == "LSTM" else want[1]
            assert_close(got_h, want_h, f"{mode} h_n", 1e-5)
    assert "_rnnc_inference" in ours.__dict__


def test_a_float64_model_trains_with_float64_results():
    """Gradients reach a float64 model's parameters, in float64, through the layer after it."""
    torch.manual_seed(12)
    theirs, ours = twins("GRU", 3, 4)
    theirs, ours = theirs.double(), ours.double()
    head = torch.nn.Linear(4, 2).double()
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    grads = []
    for module in (theirs, ours):
        module.zero_grad(), head.zero_grad()
        y, h = module(x)
        assert y.dtype == torch.float64 and h.dtype == torch.float64
        head(y).pow(2).sum().backward()
        grads.append((module.weight_hh_l0.grad.clone(), head.weight.grad.clone()))
    assert grads[1][0].dtype == torch.float64
    for got, want, what in zip(grads[1], grads[0], ["W_hh grad", "the head's weight grad"]):
        assert_close(got, want, what, 1e-4)


# ---- second derivatives: torch's for the built-in cells, refused (never None or zero) otherwise

@pytest.mark.parametrize("loss", ["weighted", "plain sum"])
def test_gradients_taken_with_create_graph_have_torchs_second_derivatives(loss):
    """A gradient penalty takes the gradient with create_graph=True, then differentiates it.
    rnnc's backward is first order: recorded, the backward of a built-in cell runs the forward
    again in torch's own operations and differentiates that (they were refused). With a plain
    sum the output gradient is a constant, so only the forward's inputs carry the second
    derivative."""
    theirs, ours = twins("GRU", 3, 4, num_layers=2, bidirectional=True)
    x = torch.randn(5, 2, 3, requires_grad=True)
    weights = torch.randn(5, 2, 8)
    second = []
    for module in (theirs, ours):
        y, _ = module(x)
        total = (y * y * weights).sum() if loss == "weighted" else y.sum()
        grad_x, grad_w = torch.autograd.grad(total, [x, module.weight_hh_l0], create_graph=True)
        penalty = grad_x.pow(2).sum() + grad_w.pow(2).sum()
        second.append(torch.autograd.grad(penalty, [x, module.weight_ih_l0,
                                                    module.weight_hh_l1_reverse]))
    for got, want, what in zip(second[1], second[0], ["x", "weight_ih_l0", "weight_hh_l1_rev"]):
        assert_close(got, want, f"second derivative, {what}", 1e-4)


@pytest.mark.parametrize("cell", ["gru", "gru under other names"])
def test_a_second_derivative_through_rnnc_layer_is_torchs(cell):
    """rnnc.Layer (numpy weights, differentiable for its input and states) replays its forward
    in torch's operations, its weights constants, for a second derivative (was refused): a
    gradient penalty's derivatives by x and h0, against torch.nn.GRU's; 2 layers, both
    directions, lengths."""
    torch.manual_seed(6)
    theirs = torch.nn.GRU(3, 4, num_layers=2, bidirectional=True)
    if cell == "gru":
        layer = rnnc.Layer("gru", input_size=3, hidden_size=4)
    else:
        layer = rnnc.Layer(GRU_UNDER_OTHER_NAMES)  # (its sizes from the weights)
    layer.load_state_dict(theirs.state_dict())
    x = torch.randn(5, 3, 3)
    h0 = torch.randn(4, 3, 4)
    lengths = torch.tensor([5, 2, 4])
    results = []
    for run in (lambda x, h: pad_packed_sequence(theirs(pack_padded_sequence(
                    x, lengths, enforce_sorted=False), h)[0], total_length=5)[0],
                lambda x, h: layer(x, {"h": h}, lengths=lengths)[0]):
        xs, hs = x.clone().requires_grad_(True), h0.clone().requires_grad_(True)
        grad_x, grad_h = torch.autograd.grad(run(xs, hs).pow(2).sum(), [xs, hs],
                                             create_graph=True)
        penalty = grad_x.pow(2).sum() + grad_h.pow(2).sum()
        results.append(torch.autograd.grad(penalty, [xs, hs]))
    for got, want, what in zip(results[1], results[0], ["x", "h0"]):
        assert_close(got, want, f"{cell}: second derivative by {what}", 1e-4)


GRU_UNDER_OTHER_NAMES = """cell gru(features, units) {
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


def test_a_cell_stacks_whatever_it_names_its_input_size():
    # Layers past the first read the layer below: the size that is the input's width (here
    # `features`, not input_size) takes its width. It had to be called input_size.
    theirs = torch.nn.GRU(3, 5, num_layers=2, bidirectional=True)
    ours = rnnc.nn.Recurrent(GRU_UNDER_OTHER_NAMES, num_layers=2, bidirectional=True,
                             features=3, units=5)
    assert ours.weight_ih_l1.shape == theirs.weight_ih_l1.shape == (15, 10)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(4, 2, 3)
    y, finals = ours(x)
    want_y, want_h = theirs(x)
    assert_close(y.detach(), want_y.detach(), "output", 1e-5)
    assert_close(finals["h"].detach(), want_h.detach(), "final h", 1e-5)


def test_a_kept_program_checks_the_parameters_against_its_own_weights():
    """A module keeps no copy of its parameters: its program compares them with the weights it
    holds, bit for bit (a NaN is itself), and any difference of value, name, shape or type is a
    new program."""
    cell = rnnc.nn.LSTMCell(3, 4)
    with torch.no_grad():
        cell.weight_hh[0, 0] = float("nan")
    cell(torch.randn(2, 3))[0].sum().backward()
    program = cell.__dict__["_rnnc_training"][-1]
    weights = {name: p.detach().numpy().copy() for name, p in cell.named_parameters()}
    assert program.same_weights(weights)
    changed = dict(weights, weight_ih=weights["weight_ih"].copy())
    changed["weight_ih"][5, 2] = np.nextafter(changed["weight_ih"][5, 2], np.float32(1))
    assert not program.same_weights(changed)
    assert not program.same_weights({k: v for k, v in weights.items() if k != "bias_hh"})
    assert not program.same_weights(dict(weights, bias_hh=weights["bias_hh"][:-1]))
    assert not program.same_weights(dict(weights, bias_hh=weights["bias_hh"].astype(np.float64)))
    assert not program.same_weights(dict(weights, weight_hh=np.asfortranarray(
        weights["weight_hh"][:4, :4])))
    # The module's call sees the same: a write torch's version counter misses is a new program.
    cell.weight_ih.data[5, 2] += 1
    cell(torch.randn(2, 3))[0].sum().backward()
    assert cell.__dict__["_rnnc_training"][-1] is not program


def test_training_calls_reuse_their_program_while_the_weights_and_masks_stay():
    # Calls between optimiser steps (a decoder stepping a cell, chunks of a long sequence) use
    # one training program; a weight change (here through .data, which torch's version counter
    # misses) or new masks build another, and the results follow the weights.
    torch.manual_seed(6)
    theirs, ours = twins("GRU", 3, 5)
    x = torch.randn(4, 2, 3, requires_grad=True)
    ours(x)[0].sum().backward()
    program = ours.__dict__["_rnnc_training"][-1]
    ours(x)[0].sum().backward()
    assert ours.__dict__["_rnnc_training"][-1] is program
    for p, q in zip(ours.parameters(), theirs.parameters()):
        p.data.mul_(0.5)
        q.data.mul_(0.5)
    assert_close(ours(x)[0].detach(), theirs(x)[0].detach(), "after a write through .data", 1e-5)
    assert ours.__dict__["_rnnc_training"][-1] is not program

    # A cell with a dropout draws new masks at each call without a seed, the same with one, all
    # from one program while the weights stay (the seed is the call's).
    model = rnnc.nn.Recurrent(DROPPING_CELL, input_size=3, hidden_size=4)
    x = torch.randn(5, 2, 3)
    assert not torch.equal(model(x)[0], model(x)[0])
    program = model.__dict__["_rnnc_training"][-1]
    first = model(x, seed=9)[0]
    assert torch.equal(model(x, seed=9)[0], first)
    assert not torch.equal(model(x, seed=10)[0], first)
    assert model.__dict__["_rnnc_training"][-1] is program
    stacked = rnnc.nn.LSTM(3, 4, num_layers=2, dropout=0.5)
    assert not torch.equal(stacked(x)[0], stacked(x)[0])  # masks between the layers
    program = stacked.__dict__["_rnnc_training"][-1]
    stacked(x)[0].sum().backward()
    assert stacked.__dict__["_rnnc_training"][-1] is program
    model.eval()  # no masks: the seed changes nothing
    with torch.enable_grad():
        x.requires_grad_()
        assert torch.equal(model(x, seed=1)[0], model(x, seed=2)[0])

    # A dropped weight's mask is drawn when the program is built: a program per seed there.
    weight_drop = rnnc.nn.Recurrent("""cell weightdrop(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w[hidden_size, input_size], u[hidden_size, hidden_size]
  return h = tanh(linear(x, w) + linear(h, dropout(u, 0.5))); output h
}""", input_size=3, hidden_size=4)
    first = weight_drop(x, seed=3)[0]
    assert torch.equal(weight_drop(x, seed=3)[0], first)
    assert not torch.equal(weight_drop(x, seed=4)[0], first)
    assert torch.equal(weight_drop(x, seed=3)[0], first)


def test_the_backward_steps_ir_is_the_tools(tmp_path):
    # `rnnc compile CELL --train --grad` prints the backward step a training run derives; the
    # modules' ir(grad=True) is the same text, for their own cell and sizes.
    import pathlib
    import subprocess

    tool = pathlib.Path(rnnc.__file__).resolve().parents[2] / "tools" / "rnnc"
    if not tool.exists():
        pytest.skip(f"no rnnc tool at {tool}")

    def compiled(cell, *options, **sizes):
        args = [str(tool), "compile", cell, "--train", "--grad", *options]
        for name, value in sizes.items():
            args += ["--size", f"{name}={value}"]
        done = subprocess.run(args, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip(), done.stderr

    lstm = rnnc.nn.LSTM(8, 16, proj_size=4)
    assert lstm.ir(grad=True).startswith("cell @lstm_proj_backward(input_size = 8")
    assert lstm.ir(grad=True).strip() == \
        compiled("lstm_proj", input_size=8, hidden_size=16, proj_size=4)[0]
    assert rnnc.nn.GRUCell(3, 5).ir(grad=True).strip() == \
        compiled("gru", input_size=3, hidden_size=5)[0]
    assert rnnc.LSTM(8, 16).ir(grad=True).strip() == \
        compiled("lstm", input_size=8, hidden_size=16)[0]
    (tmp_path / "dropping.cell").write_text(DROPPING_CELL)
    recurrent = rnnc.nn.Recurrent(DROPPING_CELL, input_size=3, hidden_size=4)
    stdout, stderr = compiled(str(tmp_path / "dropping.cell"), "--print-after-all",
                              input_size=3, hidden_size=4)
    assert recurrent.ir(grad=True).strip() == stdout
    every_pass = recurrent.ir(after="all", grad=True)
    assert "// ----- IR after fuse-matmul" in every_pass
    assert every_pass.strip() == stderr.strip()


EMPTY_CASES = [("LSTM", dict(num_layers=2, bidirectional=True, proj_size=3)),
               ("GRU", dict(batch_first=True)), ("RNN", dict(nonlinearity="relu")),
               ("LSTMCell", dict()), ("GRUCell", dict())]


@pytest.mark.parametrize("mode,options", EMPTY_CASES, ids=[m for m, _ in EMPTY_CASES])
def test_an_empty_batch_gives_torchs_empty_results_and_zero_gradients(mode, options):
    # Was: "input has shape [4, 0, 4]: T and B must be at least 1".
    theirs, ours = twins(mode, 4, 5, **options)
    cell = mode.endswith("Cell")
    x = torch.randn(0, 4) if cell else \
        torch.randn(0, 6, 4) if options.get("batch_first") else torch.randn(6, 0, 4)
    results = {}
    for name, module in (("torch", theirs), ("rnnc", ours), ("scripted", torch.jit.script(ours))):
        given = x.clone().requires_grad_()
        out = module(given)
        flat = [out] if isinstance(out, torch.Tensor) else \
            [out[0], *(out[1] if isinstance(out[1], tuple) else (out[1],))] if not cell else \
            list(out)
        results[name] = [t.shape for t in flat]
        if name != "scripted":
            sum(t.sum() for t in flat).backward()
            for p_name, p in module.named_parameters():
                assert p.grad is not None and not p.grad.any(), f"{name}: {p_name}"
            assert given.grad.shape == x.shape
            module.zero_grad()
    assert results["rnnc"] == results["torch"]
    assert results["scripted"] == results["torch"]
