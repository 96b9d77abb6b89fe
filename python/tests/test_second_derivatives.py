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

    class Output(torch.nn.Module):
        def __init__(self, layer):
            super().__init__()
            self.layer = layer

        def forward(self, x):
            return self.layer(x)[0]

    want = penalty_gradients(theirs, x, None, False)
    got = penalty_gradients(Output(ours), x, None, False)
    for g, w in zip(got, want):
        assert_close(g, w, "Recurrent('gru'): second derivative")
