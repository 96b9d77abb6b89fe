"""rnnc.nn: torch modules whose forward and backward are rnnc's, against torch autograd and
torch.autograd.gradcheck."""

import pytest

torch = pytest.importorskip("torch")

import rnnc  # noqa: E402
import rnnc.nn  # noqa: E402
from torch.nn.utils.rnn import pack_padded_sequence  # noqa: E402


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
