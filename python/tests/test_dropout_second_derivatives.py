"""Second derivatives through the dropout masks rnnc draws in training (between layers, and a
cell's own dropouts of rows and of weights): the recorded backward replays the forward in torch's
operations with the masks the call drew (rnnc/_dropout_masks.py), so a gradient penalty on a
model that trains with dropout gets its derivatives instead of a refusal. The oracles: the masks
written out from their definition (dropout_definition.py), torch.nn's recurrences and cells
written by hand in float64 with those masks, and rnnc's own first-order backward."""

import pytest

torch = pytest.importorskip("torch")

import rnnc.nn  # noqa: E402
from rnnc import _rnnc  # noqa: E402
from dropout_definition import between_layers_mask, dropout_mask  # noqa: E402
from rnnc._autograd import torch_recurrence  # noqa: E402
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence  # noqa: E402


def assert_close(got, want, what, tolerance=1e-4):
    scale = max(1e-6, float(want.abs().max()))
    error = float((got.double() - want.double()).abs().max()) / scale
    assert error <= tolerance, f"{what}: error {error:.3g} relative to {scale:.3g}"


def seed_of_next_call(generator_seed):
    """The seed an rnnc.nn module's next training call draws its masks from: torch's generator's
    next draw, which torch.manual_seed(generator_seed) (called here again) makes reproducible."""
    torch.manual_seed(generator_seed)
    seed = int(torch.randint(0, 2**62, ()))
    torch.manual_seed(generator_seed)
    return seed


def test_the_masks_are_the_runtimes_hash_written_out():
    rows = [[0, 7, -1], [12, 3, 5]]
    got = _rnnc.dropout_mask(99, 2, rows, 6, 0.4)
    assert got.shape == (2, 3, 6)
    for i, line in enumerate(rows):
        for j, row in enumerate(line):
            want = torch.ones(6) if row < 0 else dropout_mask(99, 2, [row], 6, 0.4)[0]
            assert torch.equal(torch.from_numpy(got[i, j]).double(), want.double()), (row, j)
    got = torch.from_numpy(_rnnc.between_layers_mask(3, 2, 5, 0.3, 1234, 1))
    assert torch.equal(got.double(), between_layers_mask(1234, 1, (3, 2, 5), 0.3))
    with pytest.raises(ValueError, match="p in"):
        _rnnc.dropout_mask(1, 0, [0], 3, 1.0)


DROPPING_EVERYWHERE = """cell dropping(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w[hidden_size, input_size], u[hidden_size, hidden_size], b[hidden_size]
  xd = dropout(x, 0.25)
  bd = dropout(b, 0.3)
  hd = dropout(h, 0.5)
  ud = dropout(u, 0.2)
  h2 = tanh(linear(xd, w, bd) + linear(hd, ud))
  return h = h2; output h2
}"""

# (module, options, lengths, batch-first input): every mask the replay must draw as rnnc did.
CONFIGURATIONS = [
    ("LSTM", dict(num_layers=3, dropout=0.4), None),
    ("LSTM", dict(num_layers=2, dropout=0.4, bidirectional=True, batch_first=True), None),
    ("LSTM", dict(num_layers=2, dropout=0.4, bidirectional=True, proj_size=3), [6, 2, 5, 2]),
    ("GRU", dict(num_layers=3, dropout=0.5, bidirectional=True), [3, 6, 6, 1]),
    ("GRU", dict(num_layers=2, dropout=0.4, weights_dtype="fp16"), [6, 2, 5, 2]),
    ("RNN", dict(num_layers=2, dropout=0.4, nonlinearity="relu", bias=False), None),
    ("Recurrent", dict(cell=DROPPING_EVERYWHERE, num_layers=2, dropout=0.3, input_size=3,
                       hidden_size=5), None),
    ("Recurrent", dict(cell=DROPPING_EVERYWHERE, num_layers=2, bidirectional=True, dropout=0.3,
                       input_size=3, hidden_size=5), [6, 2, 5, 2]),
    ("Recurrent", dict(cell=DROPPING_EVERYWHERE, bidirectional=True, batch_first=True,
                       input_size=3, hidden_size=5), None),
]


@pytest.mark.parametrize("mode,options,lengths", CONFIGURATIONS,
                         ids=[f"{m}-{i}" for i, (m, _, _) in enumerate(CONFIGURATIONS)])
def test_the_recorded_backward_draws_the_masks_the_forward_drew(mode, options, lengths):
    # One training call, differentiated twice: by rnnc's own backward (the masks the runtime
    # kept) and by the recorded one (create_graph=True: the forward replayed in torch's
    # operations with the masks drawn again). The gradients agree only where every mask does.
    torch.manual_seed(40)
    options = dict(options)
    module = (rnnc.nn.Recurrent(options.pop("cell"), **options) if mode == "Recurrent"
              else getattr(rnnc.nn, mode)(3, 5, **options))
    batch_first = options.get("batch_first", False)
    x = torch.randn(4, 6, 3) if batch_first else torch.randn(6, 4, 3)
    x.requires_grad_(True)
    given = x if lengths is None else pack_padded_sequence(x, torch.tensor(lengths), batch_first,
                                                          enforce_sorted=False)
    y = module(given)[0]
    if lengths is not None:
        y = pad_packed_sequence(y, batch_first)[0]
    loss = (y * y).sum()
    wrt = [x, *module.parameters()]
    rnnc_backward = torch.autograd.grad(loss, wrt, retain_graph=True)
    recorded = torch.autograd.grad(loss, wrt, create_graph=True)
    for name, got, want in zip(["x"] + [n for n, _ in module.named_parameters()], recorded,
                               rnnc_backward):
        assert_close(got, want, f"{mode} {options}: d/d{name}", 1e-5)
    if mode == "Recurrent" and lengths is None and not options.get("bidirectional"):
        # x reaches the loss through its one dropout alone: its gradient is zero where dropped
        assert 0.1 < float((rnnc_backward[0] == 0).double().mean()) < 0.4


def test_a_gradient_penalty_through_dropout_between_layers_is_torchs_with_the_masks():
    # The oracle: torch.nn.LSTM's layers one at a time in float64, each output but the last
    # times the mask rnnc draws between layers, written out from its definition.
    torch.manual_seed(41)
    ours = rnnc.nn.LSTM(3, 4, num_layers=2, bidirectional=True, dropout=0.4)
    layers = [torch.nn.LSTM(3 if k == 0 else 8, 4, bidirectional=True).double() for k in (0, 1)]
    for k, layer in enumerate(layers):
        layer.load_state_dict({name: getattr(ours, name.replace("_l0", f"_l{k}")).double()
                               for name, _ in layer.named_parameters()})
    x = torch.randn(5, 2, 3, dtype=torch.float64)
    seed = seed_of_next_call(7)

    def by_hand(x):
        y = layers[0](x)[0] * between_layers_mask(seed, 0, (5, 2, 8), 0.4)
        return layers[1](y)[0]

    results = []
    for forward, wrt_params in ((lambda x: ours(x.float())[0], list(ours.parameters())),
                                (by_hand, [p for layer in layers for p in layer.parameters()])):
        xs = x.clone().requires_grad_(True)
        y = forward(xs)
        grad_x, = torch.autograd.grad(y.pow(2).sum(), xs, create_graph=True)
        penalty = (grad_x.norm() - 1) ** 2
        results.append((y.detach(), *torch.autograd.grad(penalty, [xs, *wrt_params])))
    names = ["output", "x"] + [n for n, _ in ours.named_parameters()]
    for name, got, want in zip(names, *results):
        assert_close(got, want, f"penalty through dropout: {name}")


def test_a_custom_cells_dropouts_have_second_derivatives_by_hand():
    # Each dropout's mask as rnnc draws it: x's and h's per row (step t's rows t * B + b, the
    # call's seed), b's and u's once for the call (their rows); streams in the cell's order.
    torch.manual_seed(42)
    steps, batch, inputs, hidden, seed = 4, 3, 3, 5, 2024
    layer = rnnc.nn.Recurrent(DROPPING_EVERYWHERE, input_size=inputs, hidden_size=hidden)
    x = torch.randn(steps, batch, inputs, dtype=torch.float64)
    mb = dropout_mask(seed, 1, [0], hidden, 0.3)[0]
    mu = dropout_mask(seed, 3, range(hidden), hidden, 0.2)

    def by_hand(x, w, u, b):
        h, ys = x.new_zeros(batch, hidden), []
        for t in range(steps):
            rows = [t * batch + r for r in range(batch)]
            mx = dropout_mask(seed, 0, rows, inputs, 0.25)
            mh = dropout_mask(seed, 2, rows, hidden, 0.5)
            h = torch.tanh((x[t] * mx) @ w.T + b * mb + (h * mh) @ (u * mu).T)
            ys.append(h)
        return torch.stack(ys)

    ours = [layer.w_l0, layer.u_l0, layer.b_l0]
    theirs = [p.detach().double().requires_grad_(True) for p in ours]
    results = []
    for forward, params in ((lambda x: layer(x.float(), seed=seed)[0], ours),
                            (lambda x: by_hand(x, *theirs), theirs)):
        xs = x.clone().requires_grad_(True)
        y = forward(xs)
        grad_x, grad_u = torch.autograd.grad(y.pow(2).sum(), [xs, params[1]], create_graph=True)
        penalty = grad_x.pow(2).sum() + grad_u.pow(2).sum()
        results.append((y.detach(), *torch.autograd.grad(penalty, [xs, *params])))
    for name, got, want in zip(["output", "x", "w", "u", "b"], *results):
        assert_close(got, want, f"custom cell's dropouts: {name}")


def test_the_bf16_replay_with_dropout_runs_as_rnnc_did():
    # Mixed precision replays rnnc's built-in cell step by step (bf16 products): with the masks
    # between layers, its forward is the one rnnc ran.
    torch.manual_seed(43)
    module = rnnc.nn.GRU(3, 5, num_layers=3, bidirectional=True, dropout=0.4,
                         weights_dtype="bf16")
    x = torch.randn(6, 4, 3)
    seed = seed_of_next_call(8)
    with torch.no_grad():
        want = module(x)[0]
        replay = torch_recurrence("gru", 3, True, False, True, None, drawn=(seed, 0.4))
        got, _ = replay(x, [None], [], list(module.parameters()), "bf16")
        without_masks, _ = torch_recurrence("gru", 3, True, False, True, None)(
            x, [None], [], list(module.parameters()), "bf16")
    assert_close(got, want, "bf16 replay with dropout", 1e-5)
    assert float((without_masks - want).abs().max()) > 1e-2
