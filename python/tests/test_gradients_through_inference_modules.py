"""rnnc.LSTM, GRU, RNN and rnnc.Layer inside a model that trains: autograd must reach the layers
below them (the input's and the initial states' gradients, as torch.nn's modules give), or the
call must refuse clearly; never a graph silently cut. Oracles: torch.nn's modules and a cell
written in torch ops, both under torch autograd."""

import pytest

torch = pytest.importorskip("torch")

import rnnc  # noqa: E402
from torch.nn.utils.rnn import pack_padded_sequence  # noqa: E402


def assert_close(ours, theirs, what, tolerance=1e-5):
    assert ours is not None, f"{what}: no gradient"
    assert ours.shape == theirs.shape, f"{what}: shape {list(ours.shape)} vs {list(theirs.shape)}"
    scale = max(1.0, float(theirs.abs().max()))
    error = float((ours - theirs).abs().max()) / scale
    assert error <= tolerance, f"{what}: max error {error:.3g} relative to {scale:.3g}"


def leaves(*tensors):
    return [t.clone().requires_grad_() for t in tensors]


CASES = [("LSTM", dict(num_layers=2, bidirectional=True)),
         ("LSTM", dict(proj_size=3, batch_first=True)),
         ("GRU", dict(num_layers=2)),
         ("RNN", dict(nonlinearity="relu", bidirectional=True))]


@pytest.mark.parametrize("mode,options", CASES, ids=[f"{m}-{o}" for m, o in CASES])
def test_input_and_initial_state_gradients_are_torchs(mode, options):
    torch.manual_seed(3)
    theirs = getattr(torch.nn, mode)(4, 5, **options).eval()
    ours = rnnc.from_torch(theirs)
    batch_first = options.get("batch_first", False)
    x = torch.randn(3, 6, 4) if batch_first else torch.randn(6, 3, 4)
    slots = (2 if options.get("bidirectional") else 1) * options.get("num_layers", 1)
    states = [torch.randn(slots, 3, options.get("proj_size") or 5)]
    if mode == "LSTM":
        states.append(torch.randn(slots, 3, 5))
    weight = torch.randn(theirs(x)[0].shape)

    grads = []
    for module in (theirs, ours):
        x_leaf, *state_leaves = leaves(x, *states)
        hx = tuple(state_leaves) if mode == "LSTM" else state_leaves[0]
        y, final = module(x_leaf, hx)
        finals = final if isinstance(final, tuple) else (final,)
        assert y.requires_grad, f"{type(module).__name__}'s output is cut from the graph"
        loss = (y * weight).sum() + sum((f * (i + 2)).sum() for i, f in enumerate(finals))
        loss.backward()
        grads.append([x_leaf.grad] + [s.grad for s in state_leaves])
    for name, g_ours, g_theirs in zip(["input", "h_0", "c_0"], grads[1], grads[0]):
        assert_close(g_ours, g_theirs, f"{mode} {options}: d loss / d {name}")
    # The weights are the module's own (not torch parameters): unchanged by a backward.
    for name, value in theirs.state_dict().items():
        assert torch.equal(ours.state_dict()[name], value), name


def test_a_packed_sequence_that_requires_grad_gets_torchs_gradient():
    torch.manual_seed(4)
    theirs = torch.nn.GRU(3, 4, bidirectional=True).eval()
    ours = rnnc.from_torch(theirs)
    x = torch.randn(5, 3, 3)
    lengths = torch.tensor([5, 2, 4])
    grads = []
    for module in (theirs, ours):
        (x_leaf,) = leaves(x)
        packed = pack_padded_sequence(x_leaf, lengths, enforce_sorted=False)
        y, h = module(packed)
        (y.data.sum() + (2 * h).sum()).backward()
        grads.append(x_leaf.grad)
    assert_close(grads[1], grads[0], "packed GRU: d loss / d input")


def test_gradients_reach_the_layer_below_in_a_model_that_trains():
    """An embedding-like linear layer under rnnc.LSTM: its weight's gradient is torch's."""
    torch.manual_seed(5)
    below = torch.nn.Linear(6, 4)
    theirs = torch.nn.LSTM(4, 5).eval()
    ours = rnnc.from_torch(theirs)
    x = torch.randn(7, 2, 6)
    grads = []
    for module in (theirs, ours):
        below.zero_grad()
        y, _ = module(below(x))
        y.pow(2).sum().backward()
        grads.append(below.weight.grad.clone())
    assert_close(grads[1], grads[0], "the layer below's weight gradient")


def test_under_no_grad_and_for_tensors_that_need_none_inference_records_nothing():
    lstm = rnnc.LSTM(4, 5)
    x = torch.randn(6, 2, 4, requires_grad=True)
    with torch.no_grad():
        y, (h, c) = lstm(x)
    assert not y.requires_grad and not h.requires_grad and not c.requires_grad
    y, _ = lstm(torch.randn(6, 2, 4))
    assert not y.requires_grad


def test_reduced_precision_weights_refuse_gradients_and_run_under_no_grad():
    lstm = rnnc.LSTM(4, 5, weights_dtype="int8")
    x = torch.randn(6, 2, 4, requires_grad=True)
    with pytest.raises(NotImplementedError, match=r"weights_dtype='int8'.*torch\.no_grad\(\)"):
        lstm(x)
    with torch.no_grad():
        y, _ = lstm(x)
    assert y.shape == (6, 2, 5)


# A minimal gated unit, and the same in torch ops for the oracle.
MGU = """
cell mgu(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w_f[hidden_size, input_size], u_f[hidden_size, hidden_size], b_f[hidden_size]
  param w_h[hidden_size, input_size], u_h[hidden_size, hidden_size]
  f = sigmoid(linear(x, w_f, b_f) + linear(h, u_f))
  candidate = tanh(linear(x, w_h) + linear(f * h, u_h))
  h2 = (1 - f) * h + f * candidate
  return h = h2; output h2
}
"""


def mgu_in_torch(w, x, h):
    ys = []
    for x_t in x:
        f = torch.sigmoid(x_t @ w["w_f"].T + w["b_f"] + h @ w["u_f"].T)
        candidate = torch.tanh(x_t @ w["w_h"].T + (f * h) @ w["u_h"].T)
        h = (1 - f) * h + f * candidate
        ys.append(h)
    return torch.stack(ys), h


@pytest.mark.parametrize("given_h0", [True, False], ids=["h0", "no-h0"])
def test_a_custom_cells_layer_passes_gradients_as_its_torch_twin(given_h0):
    torch.manual_seed(6)
    shapes = {"w_f": (5, 3), "u_f": (5, 5), "b_f": (5,), "w_h": (5, 3), "u_h": (5, 5)}
    weights = {name: torch.rand(shape) - 0.5 for name, shape in shapes.items()}
    layer = rnnc.Layer(MGU)
    layer.load_state_dict(weights)
    x_ours, h_ours, x_theirs, h_theirs = leaves(*([torch.randn(6, 2, 3), torch.randn(1, 2, 5)] * 2))
    y, final = layer(x_ours, {"h": h_ours} if given_h0 else None)
    want_y, want_h = mgu_in_torch(weights, x_theirs, h_theirs[0] if given_h0 else torch.zeros(2, 5))
    assert_close(y.detach(), want_y.detach(), "output")
    weight = torch.randn(y.shape)
    ((y * weight).sum() + 3 * final["h"].sum()).backward()
    ((want_y * weight).sum() + 3 * want_h.sum()).backward()
    assert_close(x_ours.grad, x_theirs.grad, "d loss / d input")
    if given_h0:
        assert_close(h_ours.grad, h_theirs.grad, "d loss / d h0")


def test_a_numpy_initial_state_beside_an_input_that_requires_grad():
    torch.manual_seed(7)
    theirs = torch.nn.GRU(3, 4).eval()
    ours = rnnc.from_torch(theirs)
    x, h0 = torch.randn(5, 2, 3), torch.randn(1, 2, 4)
    grads = []
    for module, hx in ((theirs, h0), (ours, h0.numpy())):
        (x_leaf,) = leaves(x)
        y, _ = module(x_leaf, hx)
        y.pow(2).sum().backward()
        grads.append(x_leaf.grad)
    assert_close(grads[1], grads[0], "d loss / d input")
