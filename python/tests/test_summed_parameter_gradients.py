"""The parameters' gradients of an rnnc.nn module's calls in one autograd graph are summed in
place by rnnc's backward and handed to autograd once (rnnc/_autograd.py, _SummedParameters),
rather than one gradient per call that autograd adds up. Every way autograd can be driven must
still give torch's gradients: torch.nn's own modules with the same weights are the oracle
(retained graphs, two graphs, gradients of some inputs only, hooks, threads, second graphs
started before a backward, parameters replaced between calls)."""

import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import rnnc.nn  # noqa: E402


def cell_twins(kind="LSTMCell", input_size=4, hidden_size=6, **kwargs):
    torch.manual_seed(41)
    theirs = getattr(torch.nn, kind)(input_size, hidden_size, **kwargs)
    ours = getattr(rnnc.nn, kind)(input_size, hidden_size, **kwargs)
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def decode(cell, xs, feedback=True):
    """A decoder's loop: each step's h goes on (and, with feedback, into the next input); the
    loss weighs every step's h differently."""
    state, loss = None, 0
    for t, x in enumerate(xs):
        if feedback and state is not None:
            h = state[0] if isinstance(state, tuple) else state
            x = x + 0.5 * h[:, :x.shape[1]]
        state = cell(x) if state is None else cell(x, state)
        h = state[0] if isinstance(state, tuple) else state
        loss = loss + (h * (t + 1) * torch.linspace(-1, 1, h.shape[1])).sum()
    return loss


def assert_grads_close(ours, theirs, what="", tolerance=2e-5):
    for (name, p), q in zip(theirs.named_parameters(), ours.parameters()):
        if p.grad is None:
            assert q.grad is None, f"{what}{name}: a gradient where torch has none"
            continue
        assert q.grad is not None, f"{what}{name}: no gradient"
        error = float((p.grad - q.grad).abs().max())
        assert error <= tolerance * (1 + float(p.grad.abs().max())), \
            f"{what}{name}: max error {error:.3g}"


def weight_sized_adds(run, module):
    """How many out-of-place additions of weight-sized tensors autograd makes in run()."""
    shapes = {tuple(p.shape) for p in module.parameters() if p.dim() == 2}
    with torch.autograd.profiler.profile(record_shapes=True) as prof:
        run()
    return sum(1 for event in prof.function_events
               if event.name == "aten::add" and event.input_shapes
               and tuple(event.input_shapes[0]) in shapes)


@pytest.mark.parametrize("kind", ["LSTMCell", "GRUCell", "RNNCell"])
def test_a_decoders_parameter_gradients_are_summed_in_place_and_are_torchs(kind):
    theirs, ours = cell_twins(kind)
    xs = torch.randn(12, 3, 4)
    decode(theirs, xs).backward()
    assert weight_sized_adds(lambda: decode(ours, xs).backward(), ours) == 0
    assert_grads_close(ours, theirs)
    # A second iteration after an optimiser step starts new sums.
    for module in (theirs, ours):
        torch.optim.SGD(module.parameters(), lr=0.1).step()
        module.zero_grad()
        decode(module, xs).backward()
    assert_grads_close(ours, theirs, "after a step: ")


def test_a_retained_graph_gives_its_gradients_at_each_backward():
    theirs, ours = cell_twins()
    xs = torch.randn(6, 2, 4)
    for module in (theirs, ours):
        loss = decode(module, xs)
        loss.backward(retain_graph=True)
        loss.backward()
    assert_grads_close(ours, theirs)


def test_two_graphs_begun_before_a_backward_each_give_their_own():
    theirs, ours = cell_twins("GRUCell")
    first, second = torch.randn(5, 2, 4), torch.randn(7, 2, 4)
    losses = {id(m): (decode(m, first), decode(m, second)) for m in (theirs, ours)}
    for module in (theirs, ours):
        losses[id(module)][0].backward()
    assert_grads_close(ours, theirs, "the first: ")
    for module in (theirs, ours):
        losses[id(module)][1].backward()
    assert_grads_close(ours, theirs, "both: ")
    # And both in one backward.
    for module in (theirs, ours):
        module.zero_grad()
        sum(decode(module, xs) for xs in (first, second)).backward()
    assert_grads_close(ours, theirs, "one backward: ")


def test_gradients_of_the_input_alone_leave_nothing_behind_for_the_parameters():
    """torch.autograd.grad with respect to the input does not run the sums' hand-over, so those
    calls must not add into them: the later backward gives the parameters torch's gradients,
    not twice theirs."""
    theirs, ours = cell_twins()
    results = []
    for module in (theirs, ours):
        xs = torch.randn(5, 2, 4, generator=torch.Generator().manual_seed(3)).requires_grad_()
        loss = decode(module, xs)
        (dx,) = torch.autograd.grad(loss, [xs], retain_graph=True)
        loss.backward()
        results.append((dx, xs.grad))
    assert torch.allclose(results[0][0], results[1][0], atol=1e-5)
    assert torch.allclose(results[0][1], results[1][1], atol=1e-5)
    assert_grads_close(ours, theirs)


def test_autograd_grad_of_the_parameters_and_backward_of_some_inputs_are_torchs():
    theirs, ours = cell_twins("RNNCell")
    xs = torch.randn(6, 2, 4)
    wanted = []
    for module in (theirs, ours):
        wanted.append(torch.autograd.grad(decode(module, xs), list(module.parameters())))
        assert all(p.grad is None for p in module.parameters())
    for mine, torchs in zip(*reversed(wanted)):
        assert torch.allclose(mine, torchs, atol=1e-5)
    for module in (theirs, ours):
        decode(module, xs).backward(inputs=[module.weight_hh])
        assert module.weight_ih.grad is None
    assert torch.allclose(ours.weight_hh.grad, theirs.weight_hh.grad, atol=1e-5)


def test_create_graph_gives_torchs_first_and_second_derivatives():
    theirs, ours = cell_twins()
    xs = torch.randn(5, 2, 4)
    grads = [torch.autograd.grad(decode(m, xs), [m.weight_hh, m.bias_ih], create_graph=True)
             for m in (theirs, ours)]
    for mine, torchs in zip(grads[1], grads[0]):
        assert torch.allclose(mine, torchs, atol=1e-5)
    for module, (grad_w, _) in zip((theirs, ours), grads):
        grad_w.pow(2).sum().backward()
    assert torch.allclose(ours.weight_ih.grad, theirs.weight_ih.grad, atol=1e-5)


def test_a_parameters_hook_sees_the_whole_gradient_once():
    theirs, ours = cell_twins("GRUCell")
    xs = torch.randn(8, 3, 4)
    seen = {id(theirs): [], id(ours): []}
    for module in (theirs, ours):
        module.weight_hh.register_hook(lambda g, key=id(module): seen[key].append(g.clone()))
        decode(module, xs).backward()
    assert len(seen[id(theirs)]) == len(seen[id(ours)]) == 1
    assert torch.allclose(seen[id(ours)][0], seen[id(theirs)][0], atol=1e-5)


def test_a_graph_dropped_without_a_backward_changes_nothing():
    theirs, ours = cell_twins()
    xs = torch.randn(5, 2, 4)
    decode(ours, torch.randn(9, 2, 4))  # its graph is dropped
    for module in (theirs, ours):
        decode(module, xs).backward()
    assert_grads_close(ours, theirs)


def test_parameters_replaced_between_calls_get_their_own_gradients():
    theirs, ours = cell_twins("RNNCell")
    xs = torch.randn(6, 2, 4)
    for module in (theirs, ours):
        old = module.weight_hh
        state = None
        loss = 0
        for t, x in enumerate(xs):
            if t == 3:
                module.weight_hh = torch.nn.Parameter(old.detach() * 0.5)
            state = module(x) if state is None else module(x, state)
            loss = loss + state.sum() * (t + 1)
        loss.backward()
        module.old_weight_hh = old
    assert torch.allclose(ours.old_weight_hh.grad, theirs.old_weight_hh.grad, atol=1e-5)
    assert torch.allclose(ours.weight_hh.grad, theirs.weight_hh.grad, atol=1e-5)
    assert torch.allclose(ours.weight_ih.grad, theirs.weight_ih.grad, atol=1e-5)


def test_threads_training_one_module_each_get_their_own_gradients():
    """Each thread's calls are summed apart (the sums are per thread), so two threads taking
    gradients of their own losses from one module at once each get torch's."""
    theirs, ours = cell_twins("LSTMCell", 4, 64)
    inputs = [torch.randn(30, 2, 4, generator=torch.Generator().manual_seed(s)) for s in (1, 2)]
    expected = [torch.autograd.grad(decode(theirs, xs), list(theirs.parameters()))
                for xs in inputs]
    results = [None, None]
    errors = []

    def work(i):
        try:
            for _ in range(10):
                results[i] = torch.autograd.grad(decode(ours, inputs[i]), list(ours.parameters()))
                for mine, torchs in zip(results[i], expected[i]):
                    assert torch.allclose(mine, torchs, atol=1e-4)
        except Exception as e:  # reported below, with the thread's name
            errors.append(f"thread {i}: {e!r}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_a_sequence_module_called_in_chunks_and_a_custom_cell_stepped_are_torchs():
    torch.manual_seed(43)
    theirs = torch.nn.LSTM(4, 6, num_layers=2)
    ours = rnnc.nn.LSTM(4, 6, num_layers=2)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(10, 2, 4)

    def chunks(module):
        y1, state = module(x[:4])
        y2, _ = module(x[4:], state)
        (y1.sum() + (y2 * 2).sum()).backward()

    chunks(theirs)
    assert weight_sized_adds(lambda: chunks(ours), ours) == 0
    for (name, p), q in zip(theirs.named_parameters(), ours.parameters()):
        assert torch.allclose(q.grad, p.grad, atol=1e-4), name

    cell = rnnc.nn.Recurrent("rnn_tanh", input_size=4, hidden_size=6)
    reference = torch.nn.RNN(4, 6)
    cell.load_state_dict({k: v for k, v in reference.state_dict().items()})
    for module in (reference, cell):
        state = None
        loss = 0
        for t in range(5):
            if module is cell:
                y, finals = cell(x[t:t + 1], None if state is None else {"h": state})
                state = finals["h"]
            else:
                y, state = reference(x[t:t + 1], state)
            loss = loss + (y * (t + 1)).sum()
        loss.backward()
    for (name, p), q in zip(reference.named_parameters(), cell.parameters()):
        assert torch.allclose(q.grad, p.grad, atol=1e-4), name


def test_modules_with_an_open_graph_copy_and_pickle():
    import copy
    import pickle
    _, ours = cell_twins()
    loss = decode(ours, torch.randn(3, 2, 4))  # sums open, not yet handed on
    for twin in (copy.deepcopy(ours), pickle.loads(pickle.dumps(ours))):
        assert "_rnnc_sums" not in twin.__dict__
        decode(twin, torch.randn(3, 2, 4)).backward()
        assert all(p.grad is not None for p in twin.parameters())
    loss.backward()
    assert all(np.isfinite(p.grad.numpy()).all() for p in ours.parameters())


def test_sums_a_failed_backward_added_to_are_refused_not_handed_on():
    from rnnc import _rnnc
    _, ours = cell_twins("GRUCell")
    ours(torch.randn(2, 4))[0].sum().backward()  # builds the training program
    program = ours.__dict__["_rnnc_training"][-1]
    x = np.random.default_rng(0).standard_normal((1, 2, 4)).astype(np.float32)
    sums = _rnnc.ParameterSums()
    _, _, tape = program.forward(x, {}, None, {})
    program.backward(tape, np.ones((1, 2, 6), np.float32), {}, sums)
    _, _, tape = program.forward(x, {}, None, {})
    with pytest.raises(ValueError, match="final state 'h'"):
        program.backward(tape, np.ones((1, 2, 6), np.float32),
                         {"h": np.ones((1, 3, 6), np.float32)}, sums)
    with pytest.raises(ValueError, match="incomplete: the backward of one of them failed"):
        sums.take()


@pytest.mark.parametrize("reentrant", [True, False])
def test_checkpointed_segments_give_torchs_gradients(reentrant):
    """torch.utils.checkpoint runs each segment's calls again inside the backward (the reentrant
    form in a backward of its own): their sums are handed on there, and all add up."""
    from torch.utils.checkpoint import checkpoint
    theirs, ours = cell_twins("GRUCell")
    xs = torch.randn(8, 2, 4)

    def segment(cell, h, x):
        for t in range(x.shape[0]):
            h = cell(x[t], h)
        return h

    for module in (theirs, ours):
        h = torch.zeros(2, 6, requires_grad=True)
        for part in (xs[:3], xs[3:]):
            h = checkpoint(lambda h, x, m=module: segment(m, h, x), h, part,
                           use_reentrant=reentrant)
        (h * torch.arange(6.0)).sum().backward()
    assert_grads_close(ours, theirs)
