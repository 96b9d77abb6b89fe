"""rnnc.LSTMCell, GRUCell and RNNCell against torch.nn's cells (the oracle) with the same
weights: one step, batched and unbatched, a decoder loop that feeds back its output, gradients
through the input and the states, and torch's errors."""

import copy
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import rnnc  # noqa: E402

KINDS = [("LSTMCell", {}), ("LSTMCell", dict(bias=False)), ("GRUCell", {}),
         ("RNNCell", {}), ("RNNCell", dict(nonlinearity="relu", bias=False))]


def twins(kind, input_size=5, hidden_size=7, **kwargs):
    torch.manual_seed(31)
    theirs = getattr(torch.nn, kind)(input_size, hidden_size, **kwargs)
    return theirs, rnnc.from_torch(theirs)


def as_tuple(result):
    return result if isinstance(result, tuple) else (result,)


def states(kind, *shape):
    if kind == "LSTMCell":
        return torch.randn(*shape), torch.randn(*shape)
    return torch.randn(*shape)


def assert_close(ours, theirs, what, tolerance=1e-5):
    assert type(ours) is type(theirs), f"{what}: {type(ours).__name__}, not {type(theirs).__name__}"
    assert ours.shape == theirs.shape, f"{what}: shape {list(ours.shape)} vs {list(theirs.shape)}"
    error = float(np.abs(np.asarray(ours, dtype=np.float64) - np.asarray(theirs)).max())
    assert error <= tolerance, f"{what}: max error {error:.3g}"


@pytest.mark.parametrize("kind,options", KINDS)
def test_a_step_is_torchs(kind, options):
    theirs, ours = twins(kind, **options)
    assert type(ours).__name__ == kind and ours.bias == options.get("bias", True)
    assert sorted(ours.state_dict()) == sorted(theirs.state_dict())
    x = torch.randn(3, 5)
    with torch.no_grad():
        for hx in (None, states(kind, 3, 7)):
            for got, want in zip(as_tuple(ours(x, hx)), as_tuple(theirs(x, hx))):
                given = "given" if hx is not None else "None"
                assert_close(got, want, f"{kind} batched, hx {given}")
        # Unbatched: [input_size] and [hidden_size] in, [hidden_size] out.
        hx = states(kind, 7)
        for got, want in zip(as_tuple(ours(x[0], hx)), as_tuple(theirs(x[0], hx))):
            assert_close(got, want, f"{kind} unbatched")
    # numpy in, numpy out.
    hx = states(kind, 3, 7)
    numpy_hx = tuple(h.numpy() for h in hx) if kind == "LSTMCell" else hx.numpy()
    with torch.no_grad():
        want = as_tuple(theirs(x, hx))
    for got, expected in zip(as_tuple(ours(x.numpy(), numpy_hx)), want):
        assert isinstance(got, np.ndarray)
        np.testing.assert_allclose(got, expected.numpy(), atol=1e-5)


@pytest.mark.parametrize("kind", ["LSTMCell", "GRUCell"])
def test_a_decoder_loop_feeding_back_its_state_stays_with_torch(kind):
    # A greedy decoder's shape: each step's input made from the last step's output.
    theirs, ours = twins(kind, 7, 7)
    hx_theirs = hx_ours = states(kind, 2, 7)
    x = torch.randn(2, 7)
    x_theirs = x_ours = x
    with torch.no_grad():
        for _ in range(30):
            hx_theirs, hx_ours = theirs(x_theirs, hx_theirs), ours(x_ours, hx_ours)
            x_theirs = torch.tanh(as_tuple(hx_theirs)[0])
            x_ours = torch.tanh(as_tuple(hx_ours)[0])
    for got, want in zip(as_tuple(hx_ours), as_tuple(hx_theirs)):
        assert_close(got, want, "after 30 steps", 1e-4)


@pytest.mark.parametrize("kind,options", KINDS)
def test_gradients_reach_the_input_and_the_states(kind, options):
    theirs, ours = twins(kind, **options)
    torch.manual_seed(32)
    x, hx = torch.randn(3, 5), states(kind, 3, 7)
    weights = [torch.randn(3, 7) for _ in as_tuple(hx)]
    grads = []
    for module in (theirs, ours):
        xg = x.clone().requires_grad_()
        hxg = tuple(h.clone().requires_grad_() for h in as_tuple(hx))
        out = as_tuple(module(xg, hxg if kind == "LSTMCell" else hxg[0]))
        sum((o * w).sum() for o, w in zip(out, weights)).backward()
        grads.append([xg.grad] + [h.grad for h in hxg])
    for got, want, what in zip(grads[1], grads[0], ["input", "h", "c"]):
        assert_close(got, want, f"{kind}: d loss / d {what}")


def test_results_come_back_in_the_inputs_type():
    theirs, ours = twins("GRUCell")
    theirs.double()
    x, h = torch.randn(3, 5, dtype=torch.float64), torch.randn(3, 7, dtype=torch.float64)
    got = ours(x, h)
    assert got.dtype == torch.float64
    with torch.no_grad():
        assert_close(got, theirs(x, h), "float64", 1e-5)


def test_reduced_precision_weights_stay_within_their_rounding():
    theirs = torch.nn.LSTMCell(64, 64)
    x, hx = torch.randn(4, 64), (torch.randn(4, 64), torch.randn(4, 64))
    with torch.no_grad():
        want = theirs(x, hx)
    for dtype in ("bf16", "fp16", "int8"):
        got = rnnc.from_torch(theirs, weights_dtype=dtype)(x, hx)
        error = max(float((g - w).abs().max()) for g, w in zip(got, want))
        assert 0 < error < 3e-2, f"{dtype}: {error}"


def test_cells_copy_and_load_state_dicts():
    theirs, ours = twins("LSTMCell")
    x = torch.randn(2, 5)
    before = ours(x)
    for copied in (copy.deepcopy(ours), pickle.loads(pickle.dumps(ours))):
        for got, want in zip(copied(x), before):
            assert torch.equal(got, want)
    fresh = rnnc.LSTMCell(5, 7)
    fresh.load_state_dict(theirs.state_dict())
    for got, want in zip(fresh(x), before):
        assert torch.equal(got, want)
    assert repr(rnnc.RNNCell(3, 4, bias=False, nonlinearity="relu")) == \
        "rnnc.RNNCell(3, 4, bias=False, nonlinearity='relu')"


@pytest.mark.parametrize("module", ["rnnc", "rnnc.nn"])
def test_bad_arguments_are_torchs_errors(module):
    cells = rnnc if module == "rnnc" else rnnc.nn  # (rnnc.nn: imported below)
    cell = cells.LSTMCell(5, 7)
    with pytest.raises(ValueError, match="Expected input to be 1D or 2D, got 3D"):
        cell(torch.randn(1, 2, 5))
    with pytest.raises(ValueError, match=r"input has shape \[2, 4\], expected \[2, 5\]"):
        cell(torch.randn(2, 4))
    with pytest.raises(ValueError, match="hx as a tuple"):
        cell(torch.randn(2, 5), torch.randn(2, 7))
    with pytest.raises(ValueError, match=r"hx\[1\] has shape \[3, 7\], expected \[2, 7\]"):
        cell(torch.randn(2, 5), (torch.randn(2, 7), torch.randn(3, 7)))
    with pytest.raises(ValueError, match=r"hx has shape \[7\], expected \[2, 7\]"):
        cells.GRUCell(5, 7)(torch.randn(2, 5), torch.randn(7))
    if module == "rnnc.nn":  # the rest are rnnc's own (torch.nn's constructor checks its own)
        return
    with pytest.raises(ValueError, match="Unknown nonlinearity"):
        rnnc.RNNCell(5, 7, nonlinearity="sigmoid")
    with pytest.raises(ValueError, match="hidden_size must be a positive integer"):
        rnnc.GRUCell(5, 0)
    with pytest.raises(KeyError, match="missing keys"):
        cell.load_state_dict({"weight_ih": torch.zeros(28, 5)})
    with pytest.raises(ValueError, match=r"state_dict\['weight_hh'\] has shape \[28, 6\]"):
        cell.load_state_dict({"weight_hh": torch.zeros(28, 6)}, strict=False)


# ---- rnnc.nn's cells: torch.nn's cell modules trained through rnnc ------------------------------

import rnnc.nn  # noqa: E402


def nn_twins(kind, **kwargs):
    torch.manual_seed(33)
    theirs = getattr(torch.nn, kind)(5, 7, **kwargs)
    ours = getattr(rnnc.nn, kind)(5, 7, **kwargs)
    ours.load_state_dict(theirs.state_dict())
    assert isinstance(ours, getattr(torch.nn, kind))
    return theirs, ours


@pytest.mark.parametrize("kind,options", KINDS)
def test_a_loop_stepping_an_nn_cell_trains_as_torchs(kind, options):
    # A decoder's training loop: each step reads the last one's state; one loss over all steps,
    # then an optimiser step, twice (the second with the weights the first changed).
    theirs, ours = nn_twins(kind, **options)
    x = torch.randn(6, 3, 5)
    weights = torch.randn(6, 3, 7)
    results = []
    for module in (theirs, ours):
        optimiser = torch.optim.SGD(module.parameters(), lr=0.5)
        for _ in range(2):
            xg = x.clone().requires_grad_()
            hx, outputs = None, []
            for t in range(6):
                hx = module(xg[t], hx)
                outputs.append(as_tuple(hx)[0])
            loss = (torch.stack(outputs) * weights).sum() + as_tuple(hx)[-1].sum()
            optimiser.zero_grad()
            loss.backward()
            grads = {name: p.grad.clone() for name, p in module.named_parameters()}
            optimiser.step()
        results.append((torch.stack(outputs).detach(), grads, xg.grad))
    (y_theirs, g_theirs, x_theirs), (y_ours, g_ours, x_ours) = results
    assert_close(y_ours, y_theirs, "outputs after an optimiser step", 1e-5)
    assert_close(x_ours, x_theirs, "d loss / d x", 1e-5)
    for name in g_theirs:
        assert_close(g_ours[name], g_theirs[name], f"d loss / d {name}", 1e-4)


def test_nn_cells_evaluate_through_one_program_and_see_every_weight_change():
    theirs, ours = nn_twins("GRUCell")
    theirs.eval(), ours.eval()
    x, h = torch.randn(3, 5), torch.randn(3, 7)
    with torch.no_grad():
        assert_close(ours(x, h), theirs(x, h), "evaluation")
        program = ours.__dict__["_rnnc_inference"][-1]
        assert_close(ours(x[0], h[0]), theirs(x[0], h[0]), "unbatched")
        assert ours.__dict__["_rnnc_inference"][-1] is program  # kept while the weights stay
        for p, q in zip(ours.parameters(), theirs.parameters()):
            p.data.mul_(0.5)  # a write torch's version counter does not see
            q.data.mul_(0.5)
        assert_close(ours(x, h), theirs(x, h), "after a write through .data")
    assert isinstance(ours(x, h), torch.Tensor)
    restored = pickle.loads(pickle.dumps(ours))
    with torch.no_grad():
        assert torch.equal(restored(x, h), ours(x, h))
