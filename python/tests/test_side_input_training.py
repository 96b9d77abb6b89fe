"""Cells with side inputs (an attention context every layer reads at each step) trained from
Python: rnnc.nn.Recurrent and rnnc.Layer under autograd give the side inputs' gradients, and the
parameters', as the same cell written in torch ops under torch autograd in float64 (the oracle:
layers stacked and both directions by hand)."""

import pytest

torch = pytest.importorskip("torch")

import rnnc  # noqa: E402
import rnnc.nn  # noqa: E402
from torch.nn.utils.rnn import pack_padded_sequence  # noqa: E402

ATTEND = """cell attend(input_size, hidden_size, context_size) {
  input x[input_size], context[context_size]
  state h[hidden_size]
  param w[hidden_size, input_size], v[hidden_size, context_size], u[hidden_size, hidden_size]
  param q[context_size, hidden_size], b[hidden_size]
  h2 = tanh(linear(x, w) + linear(context * sigmoid(linear(h, q)), v) + linear(h, u, b))
  return h = h2; output h2
}"""

STEPS, BATCH, INPUTS, HIDDEN, CONTEXT = 5, 3, 4, 6, 2


def assert_close(ours, theirs, what, tolerance=1e-5):
    assert ours is not None, f"{what}: no gradient"
    assert ours.shape == theirs.shape, f"{what}: shape {list(ours.shape)} vs {list(theirs.shape)}"
    scale = max(1.0, float(theirs.abs().max()))
    error = float((ours.double() - theirs).abs().max()) / scale
    assert error <= tolerance, f"{what}: max error {error:.3g} relative to {scale:.3g}"


def reference(params, x, context, h0, num_layers, directions, lengths=None):
    """The stacked cell by hand, [T, B, F] tensors, each sequence run over its own length (the
    reverse direction from its own end); outputs past a length are zero, a final state is the
    one at the sequence's last step."""
    steps, batch = x.shape[0], x.shape[1]
    lengths = lengths or [steps] * batch
    layer_input, finals = x, []
    for layer in range(num_layers):
        outputs = []
        for direction in range(directions):
            suffix = f"_l{layer}" + ("_reverse" if direction else "")
            w, v, u, q, b = (params[n + suffix] for n in ("w", "v", "u", "q", "b"))
            out = torch.zeros(steps, batch, u.shape[0], dtype=torch.float64)
            out_rows, final_rows = [], []
            for r in range(batch):
                h = h0[layer * directions + direction, r]
                order = range(lengths[r]) if direction == 0 else reversed(range(lengths[r]))
                column = {}
                for t in order:
                    gate = torch.sigmoid(h @ q.T)
                    h = torch.tanh(layer_input[t, r] @ w.T + (context[t, r] * gate) @ v.T
                                   + h @ u.T + b)
                    column[t] = h
                out_rows.append(torch.stack([column.get(t, torch.zeros_like(h))
                                             for t in range(steps)]))
                final_rows.append(h)
            out = torch.stack(out_rows, dim=1)
            outputs.append(out)
            finals.append(torch.stack(final_rows))
        layer_input = torch.cat(outputs, dim=2)
    return layer_input, torch.stack(finals)


def double_leaves(model):
    return {name: p.detach().double().requires_grad_() for name, p in model.named_parameters()}


@pytest.mark.parametrize("num_layers,bidirectional", [(1, False), (2, True)])
def test_recurrent_trains_a_cell_with_a_side_input(num_layers, bidirectional):
    torch.manual_seed(21)
    directions = 2 if bidirectional else 1
    model = rnnc.nn.Recurrent(ATTEND, num_layers=num_layers, bidirectional=bidirectional,
                              input_size=INPUTS, hidden_size=HIDDEN, context_size=CONTEXT)
    assert model.side_input_names == ["context"]
    x = torch.randn(STEPS, BATCH, INPUTS, requires_grad=True)
    context = torch.randn(STEPS, BATCH, CONTEXT, requires_grad=True)
    h0 = torch.randn(num_layers * directions, BATCH, HIDDEN, requires_grad=True)
    dy = torch.randn(STEPS, BATCH, directions * HIDDEN)
    dh = torch.randn(num_layers * directions, BATCH, HIDDEN)
    y, finals = model(x, {"h": h0}, context=context)
    ((y * dy).sum() + (finals["h"] * dh).sum()).backward()

    params = double_leaves(model)
    xd, cd, hd = (t.detach().double().requires_grad_() for t in (x, context, h0))
    want_y, want_h = reference(params, xd, cd, hd, num_layers, directions)
    ((want_y * dy.double()).sum() + (want_h * dh.double()).sum()).backward()
    assert_close(y.detach(), want_y.detach(), "output")
    assert_close(finals["h"].detach(), want_h.detach(), "final h")
    assert_close(context.grad, cd.grad, "d loss / d context")
    assert_close(x.grad, xd.grad, "d loss / d x")
    assert_close(h0.grad, hd.grad, "d loss / d h0")
    for name, p in model.named_parameters():
        assert_close(p.grad, params[name].grad, f"d loss / d {name}")


def test_packed_and_batch_first_side_inputs_train_over_each_sequences_length():
    torch.manual_seed(22)
    model = rnnc.nn.Recurrent(ATTEND, bidirectional=True, batch_first=True, input_size=INPUTS,
                              hidden_size=HIDDEN, context_size=CONTEXT)
    lengths = [3, 5, 2]
    x = torch.randn(BATCH, STEPS, INPUTS, requires_grad=True)
    context = torch.randn(BATCH, STEPS, CONTEXT, requires_grad=True)
    packed_x = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    packed_context = pack_padded_sequence(context, lengths, batch_first=True,
                                          enforce_sorted=False)
    y, finals = model(packed_x, context=packed_context)
    assert isinstance(y, torch.nn.utils.rnn.PackedSequence)
    dy = torch.randn(y.data.shape)
    (y.data * dy).sum().backward()

    # The padded call with lengths gives the same, and the oracle runs each sequence alone.
    params = double_leaves(model)
    xd, cd = (t.detach().double().transpose(0, 1).requires_grad_() for t in (x, context))
    h0 = torch.zeros(2, BATCH, HIDDEN, dtype=torch.float64)
    want_y, want_h = reference(params, xd, cd, h0, 1, 2, lengths)
    want_packed = pack_padded_sequence(want_y, lengths, enforce_sorted=False)
    (want_packed.data * dy.double()).sum().backward()
    assert_close(y.data.detach(), want_packed.data.detach(), "packed output")
    assert_close(finals["h"].detach(), want_h.detach(), "final h")
    assert_close(context.grad, cd.grad.transpose(0, 1), "d loss / d context")
    assert_close(x.grad, xd.grad.transpose(0, 1), "d loss / d x")
    for name, p in model.named_parameters():
        assert_close(p.grad, params[name].grad, f"d loss / d {name}")
    # Past each length the side input reaches nothing.
    for r, length in enumerate(lengths):
        assert int(torch.count_nonzero(context.grad[r, length:])) == 0


def test_evaluation_with_a_side_input_matches_training_modes_forward():
    torch.manual_seed(23)
    model = rnnc.nn.Recurrent(ATTEND, num_layers=2, input_size=INPUTS, hidden_size=HIDDEN,
                              context_size=CONTEXT)
    x, context = torch.randn(STEPS, BATCH, INPUTS), torch.randn(STEPS, BATCH, CONTEXT)
    model.eval()
    with torch.no_grad():
        y, finals = model(x, context=context)  # the inference program
    params = {name: p.detach().double() for name, p in model.named_parameters()}
    want_y, want_h = reference(params, x.double(), context.double(),
                               torch.zeros(2, BATCH, HIDDEN, dtype=torch.float64), 2, 1)
    assert_close(y, want_y, "output")
    assert_close(finals["h"], want_h, "final h")


def test_side_inputs_are_checked_by_name_and_layout():
    model = rnnc.nn.Recurrent(ATTEND, input_size=INPUTS, hidden_size=HIDDEN,
                              context_size=CONTEXT)
    x, context = torch.randn(STEPS, BATCH, INPUTS), torch.randn(STEPS, BATCH, CONTEXT)
    with pytest.raises(ValueError, match="reads context besides x"):
        model(x)
    with pytest.raises(ValueError, match="no input ctx; its side inputs: context"):
        model(x, context=context, ctx=context)
    with pytest.raises(ValueError, match="context"):
        model(x, context=torch.randn(STEPS, BATCH, CONTEXT + 1))
    packed = pack_padded_sequence(context, [5, 4, 3])
    with pytest.raises(TypeError, match="PackedSequence, but x is not"):
        model(x, context=packed)
    with pytest.raises(ValueError, match="lengths"):
        model(pack_padded_sequence(x, [5, 5, 3]), context=packed)
    one_input = rnnc.nn.Recurrent("gru", input_size=INPUTS, hidden_size=HIDDEN)
    with pytest.raises(ValueError, match="no input context; its side inputs: none"):
        one_input(x, context=context)


def test_a_layer_gives_a_side_inputs_gradient_under_autograd():
    torch.manual_seed(24)
    model = rnnc.nn.Recurrent(ATTEND, input_size=INPUTS, hidden_size=HIDDEN,
                              context_size=CONTEXT)
    layer = rnnc.Layer(ATTEND, context_size=CONTEXT)
    layer.load_state_dict({name: p.detach() for name, p in model.named_parameters()})
    x = torch.randn(STEPS, BATCH, INPUTS)  # needs no gradient: only the context does
    context = torch.randn(STEPS, BATCH, CONTEXT, requires_grad=True)
    y, final = layer(x, context=context)
    dy = torch.randn(y.shape)
    ((y * dy).sum() + final["h"].sum()).backward()

    params = {name: p.detach().double() for name, p in model.named_parameters()}
    cd = context.detach().double().requires_grad_()
    want_y, want_h = reference(params, x.double(), cd,
                               torch.zeros(1, BATCH, HIDDEN, dtype=torch.float64), 1, 1)
    ((want_y * dy.double()).sum() + want_h.sum()).backward()
    assert_close(y.detach(), want_y.detach(), "output")
    assert_close(context.grad, cd.grad, "d loss / d context")


def test_inputs_that_enter_alike_get_the_same_gradient():
    # x and a enter only as x + a: their gradients are equal, element by element, whatever the
    # backward computes (a cell without parameters trains too: there is nothing to update).
    model = rnnc.nn.Recurrent("""cell two(n) {
  input x[n], a[n]
  state h[n]
  return h = tanh(x + a + 0.5 * h); output h
}""", bidirectional=True, n=3)
    assert list(model.parameters()) == []
    torch.manual_seed(25)
    x = torch.randn(4, 2, 3, requires_grad=True)
    a = torch.randn(4, 2, 3, requires_grad=True)
    y, finals = model(x, a=a)
    ((y * torch.randn(y.shape)).sum() + finals["h"].sum()).backward()
    assert float(x.grad.abs().max()) > 0
    assert torch.equal(x.grad, a.grad)
