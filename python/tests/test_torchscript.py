"""rnnc.nn's modules inside torch.jit.trace and torch.jit.script: the traced or scripted model runs
rnnc on the inputs it is given (the operator rnnc::forward), trains, and survives torch.jit.save
and torch.jit.load, all against torch.nn's modules of the same weights."""

import os
import subprocess
import sys
import textwrap
import warnings
from typing import Optional, Tuple

import pytest

torch = pytest.importorskip("torch")

import rnnc  # noqa: E402
import rnnc.nn  # noqa: E402
from torch.nn.utils.rnn import (PackedSequence, pack_padded_sequence,  # noqa: E402
                                pad_packed_sequence)


class Classifier(torch.nn.Module):
    """A model as users write them: a recurrent layer (torch's or rnnc's), then a linear head."""

    def __init__(self, library, mode, input_size, hidden_size, **options):
        super().__init__()
        self.rnn = getattr(library, mode)(input_size, hidden_size, **options)
        directions = 2 if options.get("bidirectional") else 1
        width = (options.get("proj_size") or hidden_size) * directions
        self.head = torch.nn.Linear(width, 3)
        self.batch_first = options.get("batch_first", False)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.head(y[:, -1] if self.batch_first else y[-1])


def twin_models(mode, **options):
    torch.manual_seed(5)
    theirs = Classifier(torch.nn, mode, 6, 8, **options)
    ours = Classifier(rnnc.nn, mode, 6, 8, **options)
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def assert_close(ours, theirs, what, tolerance=1e-5):
    scale = max(1e-6, float(theirs.abs().max()))
    error = float((ours - theirs).abs().max()) / scale
    assert error <= tolerance, f"{what}: max error {error:.3g} relative to {scale:.3g}"


def trace(model, example):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        return torch.jit.trace(model, example)


MODELS = [("LSTM", dict(num_layers=2, bidirectional=True)), ("LSTM", dict(proj_size=4)),
          ("GRU", dict(batch_first=True)), ("RNN", dict(nonlinearity="relu", bias=False))]
IDS = [f"{mode}-{options}" for mode, options in MODELS]


def example(options, steps, batch):
    return torch.randn(batch, steps, 6) if options.get("batch_first") else \
        torch.randn(steps, batch, 6)


@pytest.mark.parametrize("mode,options", MODELS, ids=IDS)
def test_a_model_traced_for_inference_runs_rnnc_on_each_new_input(mode, options):
    # Before rnnc::forward, the trace recorded the layer's output as a constant: every input
    # gave the example's output.
    theirs, ours = twin_models(mode, **options)
    ours.eval()
    with torch.no_grad():
        traced = trace(ours, example(options, 5, 3))
        for steps, batch in ((5, 3), (9, 2), (1, 7)):
            x = example(options, steps, batch)
            assert_close(traced(x), theirs(x), f"traced on {steps}x{batch}")
    assert "rnnc::forward" in str(traced.inlined_graph)


@pytest.mark.parametrize("mode,options", MODELS, ids=IDS)
def test_a_scripted_model_runs_rnnc_and_gives_torchs_results(mode, options):
    theirs, ours = twin_models(mode, **options)
    scripted = torch.jit.script(ours)
    assert isinstance(ours.rnn, getattr(rnnc.nn, mode))  # the model itself is unchanged
    with torch.no_grad():
        for steps, batch in ((4, 3), (1, 1)):
            x = example(options, steps, batch)
            assert_close(scripted(x), theirs(x), f"scripted on {steps}x{batch}")
    assert "rnnc::forward" in str(scripted.inlined_graph)


@pytest.mark.parametrize("how", ["trace", "script"])
def test_a_traced_or_scripted_model_trains_with_torchs_gradients(how):
    theirs, ours = twin_models("LSTM", num_layers=2)
    compiled = trace(ours, torch.randn(4, 2, 6)) if how == "trace" else torch.jit.script(ours)
    x = torch.randn(7, 3, 6)
    for model in (theirs, compiled):
        model.zero_grad()
        model(x).pow(2).sum().backward()
    theirs_grads = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():  # the compiled model's parameters are ours
        assert p.grad is not None, name
        assert_close(p.grad, theirs_grads[name].grad, f"{how}: gradient of {name}", 1e-4)


def test_a_traced_model_reads_its_parameters_at_each_call():
    theirs, ours = twin_models("GRU")
    with torch.no_grad():
        traced = trace(ours, torch.randn(3, 2, 6))
        for model in (theirs, ours):
            model.rnn.weight_hh_l0.mul_(-0.5)
        x = torch.randn(4, 2, 6)
        assert_close(traced(x), theirs(x), "after an in-place weight update")


def test_two_layers_of_one_shape_in_a_traced_model_keep_their_own_weights():
    torch.manual_seed(2)
    theirs = torch.nn.Sequential(torch.nn.GRU(6, 6), Select(), torch.nn.GRU(6, 6), Select())
    ours = torch.nn.Sequential(rnnc.nn.GRU(6, 6), Select(), rnnc.nn.GRU(6, 6), Select())
    ours.load_state_dict(theirs.state_dict())
    with torch.no_grad():
        traced = trace(ours, torch.randn(3, 2, 6))
        for _ in range(2):
            x = torch.randn(5, 4, 6)
            assert_close(traced(x), theirs(x), "two GRUs of one spec")


class Select(torch.nn.Module):
    def forward(self, pair):
        return pair[0]


@pytest.mark.parametrize("mode", ["LSTMCell", "GRUCell", "RNNCell"])
@pytest.mark.parametrize("how", ["trace", "script"])
def test_one_step_cells_trace_and_script(mode, how):
    torch.manual_seed(3)
    theirs = getattr(torch.nn, mode)(6, 8)
    ours = getattr(rnnc.nn, mode)(6, 8)
    ours.load_state_dict(theirs.state_dict())
    with torch.no_grad():
        compiled = trace(ours, torch.randn(2, 6)) if how == "trace" else torch.jit.script(ours)
        x = torch.randn(5, 6)
        h = torch.randn(5, 8)
        hx = (h, torch.randn(5, 8)) if mode == "LSTMCell" else h
        first = lambda r: r[0] if isinstance(r, tuple) else r  # noqa: E731
        assert_close(first(compiled(x, hx) if how == "script" else compiled(x)),
                     first(theirs(x) if how == "trace" else theirs(x, hx)), f"{how} {mode}")
        if how == "script":  # unbatched, and without hx
            assert_close(first(compiled(x[0])), first(theirs(x[0])), f"{mode} unbatched")


def test_a_traced_model_survives_save_and_load_in_a_new_process(tmp_path):
    theirs, ours = twin_models("LSTM", bidirectional=True, batch_first=True)
    ours.eval()
    with torch.no_grad():
        traced = trace(ours, torch.randn(2, 5, 6))
        scripted = torch.jit.script(ours)
        x = torch.randn(3, 8, 6)
        expected = theirs(x)
    torch.jit.save(traced, str(tmp_path / "traced.pt"))
    torch.jit.save(scripted, str(tmp_path / "scripted.pt"))
    torch.save(x, str(tmp_path / "x.pt"))
    torch.save(expected, str(tmp_path / "expected.pt"))
    check = textwrap.dedent(f"""
        import torch, rnnc.nn
        x = torch.load({str(tmp_path / 'x.pt')!r})
        expected = torch.load({str(tmp_path / 'expected.pt')!r})
        for name in ("traced", "scripted"):
            model = torch.jit.load({str(tmp_path)!r} + "/" + name + ".pt")
            with torch.no_grad():
                error = float((model(x) - expected).abs().max())
            assert error < 1e-5, (name, error)
        print("loaded both")
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "loaded both" in done.stdout


def test_a_recurrent_cell_traces_with_lengths_and_side_inputs(tmp_path):
    source = tmp_path / "gated.cell"
    source.write_text(textwrap.dedent("""\
        cell gated(input_size, hidden_size, context_size) {
          input x[input_size], context[context_size]
          state h[hidden_size]
          param w[hidden_size, input_size], v[hidden_size, context_size]
          param u[hidden_size, hidden_size], b[hidden_size]
          g = sigmoid(linear(context, v))
          h2 = g * tanh(linear(x, w) + linear(h, u, b)) + (1 - g) * h
          return h = h2; output h2
        }
    """))
    torch.manual_seed(4)
    model = Attending(rnnc.nn.Recurrent(str(source), input_size=6, context_size=2,
                                        hidden_size=5)).eval()
    with torch.no_grad():
        traced = trace(model, (torch.randn(4, 3, 6), torch.tensor([4, 2, 3]),
                               torch.randn(4, 3, 2)))
        source.unlink()  # the trace keeps the cell's source, not the file's path
        x, lengths, context = torch.randn(6, 2, 6), torch.tensor([3, 6]), torch.randn(6, 2, 2)
        assert_close(traced(x, lengths, context), model(x, lengths, context), "traced Recurrent")


class Attending(torch.nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x, lengths, context):
        return self.layer(x, lengths=lengths, context=context)[0]


class Packing(torch.nn.Module):
    """The usual way to run padded batches of several lengths: packed inside the model."""

    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x, lengths):
        packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
        out, final = self.rnn(packed)
        padded, _ = pad_packed_sequence(out, total_length=x.shape[0])
        return padded, final["h"] if isinstance(final, dict) else final


@pytest.mark.parametrize("mode", ["LSTM", "GRU", "Recurrent"])
def test_a_model_packing_its_batch_traces_for_any_lengths(mode):
    # Was refused: the PackedSequence's batch sizes became constants of the trace.
    torch.manual_seed(8)
    if mode == "Recurrent":
        theirs = torch.nn.GRU(6, 5, num_layers=2, bidirectional=True)
        ours = rnnc.nn.Recurrent("gru", num_layers=2, bidirectional=True, input_size=6,
                                 hidden_size=5)
        ours.load_state_dict(theirs.state_dict())
    else:
        theirs = getattr(torch.nn, mode)(6, 5, num_layers=2, bidirectional=True)
        ours = getattr(rnnc.nn, mode)(6, 5, num_layers=2, bidirectional=True)
        ours.load_state_dict(theirs.state_dict())
    theirs, ours = Packing(theirs).eval(), Packing(ours).eval()
    with torch.no_grad():
        traced = trace(ours, (torch.randn(5, 3, 6), torch.tensor([5, 2, 4])))
        for lengths in ([3, 7, 1, 6], [2, 2]):
            x = torch.randn(max(lengths), len(lengths), 6)
            lengths = torch.tensor(lengths)
            y, final = traced(x, lengths)
            want_y, want_final = theirs(x, lengths)
            assert_close(y, want_y, f"output, lengths {lengths.tolist()}")
            if mode == "LSTM":
                final, want_final = final[0], want_final[0]
            assert_close(final, want_final, f"h_n, lengths {lengths.tolist()}")


def test_a_traced_packing_model_trains_with_torchs_gradients():
    torch.manual_seed(9)
    theirs, ours = torch.nn.LSTM(6, 5), rnnc.nn.LSTM(6, 5)
    ours.load_state_dict(theirs.state_dict())
    traced = trace(Packing(ours), (torch.randn(5, 3, 6), torch.tensor([5, 2, 4])))
    x, lengths = torch.randn(7, 4, 6), torch.tensor([7, 3, 5, 1])
    for model in (Packing(theirs), traced):
        model.zero_grad()
        model(x, lengths)[0].pow(2).sum().backward()
    for (name, want), got in zip(theirs.named_parameters(), ours.parameters()):
        assert_close(got.grad, want.grad, f"gradient of {name}", 1e-4)


class RunningACell(torch.nn.Module):
    """A scripted model calling rnnc.nn.Recurrent with lengths and an initial state."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, h0: torch.Tensor
                ) -> Tuple[torch.Tensor, torch.Tensor]:
        y, finals = self.layer(x, {"h": h0}, lengths)
        return y, finals["h"]


def torch_gru_packed(gru, x, lengths, h0):
    y, h_n = gru(pack_padded_sequence(x, lengths, enforce_sorted=False), h0)
    return pad_packed_sequence(y, total_length=x.shape[0])[0], h_n


def recurrent_gru_twins(seed, **layout):
    """torch.nn.GRU(6, 5) and rnnc.nn.Recurrent("gru") of the same weights and layout."""
    torch.manual_seed(seed)
    theirs = torch.nn.GRU(6, 5, **layout)
    ours = rnnc.nn.Recurrent("gru", input_size=6, hidden_size=5, **layout)
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def test_a_scripted_model_runs_a_recurrent_cell_with_lengths_and_states():
    # Was refused: Recurrent's forward takes **side_inputs, which TorchScript cannot compile.
    theirs, ours = recurrent_gru_twins(12, num_layers=2, bidirectional=True)
    scripted = torch.jit.script(RunningACell(ours))
    for lengths in ([3, 7, 1, 6], [2, 2]):
        x, h0 = torch.randn(max(lengths), len(lengths), 6), torch.randn(4, len(lengths), 5)
        lengths = torch.tensor(lengths)
        with torch.no_grad():
            got, want = scripted(x, lengths, h0), torch_gru_packed(theirs, x, lengths, h0)
        assert_close(got[0], want[0], f"output, lengths {lengths.tolist()}")
        assert_close(got[1], want[1], f"h_n, lengths {lengths.tolist()}")
    x, lengths, h0 = torch.randn(5, 3, 6), torch.tensor([5, 2, 4]), torch.randn(4, 3, 5)
    for model in (scripted, lambda *args: torch_gru_packed(theirs, *args)):
        y, h_n = model(x, lengths, h0)
        (y.pow(2).sum() + h_n.sum()).backward()
    for (name, want), got in zip(theirs.named_parameters(), ours.parameters()):
        assert_close(got.grad, want.grad, f"gradient of {name}", 1e-4)
    assert "rnnc::forward" in str(scripted.inlined_graph)


def test_a_scripted_custom_cell_survives_save_and_load_without_its_file(tmp_path):
    source = tmp_path / "mgu.cell"
    source.write_text(open(os.path.join(os.path.dirname(__file__), "..", "..", "examples",
                                        "mgu.cell")).read())
    torch.manual_seed(13)
    layer = rnnc.nn.Recurrent(str(source), input_size=6, hidden_size=5).eval()
    scripted = torch.jit.script(layer)  # alone
    torch.jit.save(scripted, tmp_path / "mgu.pt")
    x, h0 = torch.randn(4, 2, 6), torch.randn(1, 2, 5)
    want_y, want_finals = layer(x, {"h": h0})
    source.unlink()  # the scripted module keeps the cell's source, not the file's path
    loaded = torch.jit.load(tmp_path / "mgu.pt")
    got_y, got_finals = loaded(x, {"h": h0})
    assert_close(got_y, want_y, "output")
    assert_close(got_finals["h"], want_finals["h"], "h_n")


GATED_WITH_CONTEXT = textwrap.dedent("""\
    cell gated(input_size, hidden_size, context_size) {
      input x[input_size], context[context_size]
      state h[hidden_size]
      param w[hidden_size, input_size], v[hidden_size, context_size]
      return h = tanh(linear(x, w) + linear(context, v) + h); output h
    }""")


class ScriptableAttending(torch.nn.Module):
    """A model giving its layer a side input as TorchScript can: side_inputs, a dict."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x, lengths: Optional[torch.Tensor], context):
        y, finals = self.layer(x, None, lengths, side_inputs={"context": context})
        return y, finals["h"]


@pytest.mark.parametrize("batch_first", [False, True])
def test_a_scripted_model_gives_a_recurrent_cell_its_side_inputs(tmp_path, batch_first):
    # Was refused: "a cell with side inputs runs in TorchScript through torch.jit.trace".
    torch.manual_seed(14)
    model = ScriptableAttending(rnnc.nn.Recurrent(
        GATED_WITH_CONTEXT, num_layers=2, bidirectional=True, batch_first=batch_first,
        input_size=6, context_size=2, hidden_size=5)).eval()
    scripted = torch.jit.script(model)
    torch.jit.save(scripted, tmp_path / "gated.pt")
    loaded = torch.jit.load(tmp_path / "gated.pt")
    shape = (2, 7) if batch_first else (7, 2)
    x, context = torch.randn(*shape, 6), torch.randn(*shape, 2)
    lengths = torch.tensor([7, 4])
    with torch.no_grad():
        want_y, want_h = model(x, lengths, context)
        # the eager layer with the side input as a keyword: the same
        keyword_y, _ = model.layer(x, lengths=lengths, context=context)
        assert torch.equal(keyword_y, want_y)
        for module in (scripted, loaded):
            y, h = module(x, lengths, context)
            assert_close(y, want_y, "output")
            assert_close(h, want_h, "h_n")
    with pytest.raises(ValueError, match=r"either in side_inputs or as keywords, not both"):
        model.layer(x, side_inputs={"context": context}, context=context)
    # Gradients reach the side input through the scripted model, as through the eager one.
    context.requires_grad_()
    scripted(x, lengths, context)[0].sum().backward()
    got = context.grad.clone()
    context.grad = None
    model(x, lengths, context)[0].sum().backward()
    assert_close(got, context.grad, "d loss / d context")


def test_a_scripted_recurrent_cell_refuses_what_it_cannot_run():
    with_context = torch.jit.script(rnnc.nn.Recurrent(GATED_WITH_CONTEXT, input_size=6,
                                                      context_size=2, hidden_size=5))
    x = torch.randn(3, 2, 6)
    with pytest.raises(Exception, match=r"the cell reads context besides x: give it in "
                                        r"side_inputs"):
        with_context(x)
    with pytest.raises(Exception, match=r"the cell has no input ctx; its side inputs: context"):
        with_context(x, None, None, {"ctx": torch.zeros(3, 2, 2)})
    with pytest.raises(Exception, match=r"side input context has shape \[3, 2, 3\], expected "
                                        r"\[3, 2, 2\]"):
        with_context(x, None, None, {"context": torch.zeros(3, 2, 3)})
    gru = torch.jit.script(rnnc.nn.Recurrent("gru", input_size=6, hidden_size=5))
    with pytest.raises(Exception, match=r"x has shape \[3, 2, 4\], expected \[T, B, 6\]"):
        gru(torch.randn(3, 2, 4))
    with pytest.raises(Exception, match=r"the cell has no state c; its states: h"):
        gru(torch.randn(3, 2, 6), {"c": torch.zeros(1, 2, 5)})
    with pytest.raises(Exception, match=r"h has shape \[1, 3, 5\], expected \[1, 2, 5\]"):
        gru(torch.randn(3, 2, 6), {"h": torch.zeros(1, 3, 5)})
    with pytest.raises(Exception, match=r"lengths has shape \[3\], expected \[2\]"):
        gru(torch.randn(3, 2, 6), None, torch.tensor([1, 2, 3]))


class ScriptablePacking(torch.nn.Module):
    """A scripted model's packing: the layer takes a PackedSequence (torch.nn's modules declare
    it to TorchScript) and, in the same model, the padded batch."""

    def __init__(self, rnn, batch_first):
        super().__init__()
        self.rnn, self.batch_first = rnn, batch_first

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, h0: torch.Tensor
                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        packed = pack_padded_sequence(x, lengths, self.batch_first, enforce_sorted=False)
        out, h_n = self.rnn(packed, h0)
        padded, _ = pad_packed_sequence(out, self.batch_first,
                                        total_length=x.size(1 if self.batch_first else 0))
        whole, _ = self.rnn(x, h0)
        return padded, h_n, whole


class ScriptableLstmPacking(ScriptablePacking):
    def forward(self, x: torch.Tensor, lengths: torch.Tensor, h0: torch.Tensor
                ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        packed = pack_padded_sequence(x, lengths, self.batch_first, enforce_sorted=False)
        c0 = torch.zeros(h0.size(0), h0.size(1), self.rnn.hidden_size)
        out, (h_n, c_n) = self.rnn(packed, (h0, c0))
        padded, _ = pad_packed_sequence(out, self.batch_first,
                                        total_length=x.size(1 if self.batch_first else 0))
        whole, _ = self.rnn(x, (h0, c0))
        return padded, torch.cat([h_n.flatten(), c_n.flatten()]), whole


PACKED = [("LSTM", dict(num_layers=2, bidirectional=True, proj_size=3)),
          ("GRU", dict(batch_first=True)), ("RNN", dict(nonlinearity="relu", num_layers=2))]


def packing_twins(mode, options):
    torch.manual_seed(10)
    theirs = getattr(torch.nn, mode)(6, 5, **options)
    ours = getattr(rnnc.nn, mode)(6, 5, **options)
    ours.load_state_dict(theirs.state_dict())
    model = ScriptableLstmPacking if mode == "LSTM" else ScriptablePacking
    batch_first = options.get("batch_first", False)
    return model(theirs, batch_first), model(ours, batch_first), batch_first


def packing_inputs(options, lengths):
    slots = options.get("num_layers", 1) * (2 if options.get("bidirectional") else 1)
    x = example(options, max(lengths), len(lengths))
    return x, torch.tensor(lengths), torch.randn(slots, len(lengths),
                                                 options.get("proj_size") or 5)


@pytest.mark.parametrize("mode,options", PACKED, ids=[m for m, _ in PACKED])
def test_a_scripted_model_packs_its_batch_as_with_torchs_modules(mode, options):
    # Was refused: the scripted forward was typed for a Tensor ("Expected a value of type
    # 'Tensor' for argument 'input' but instead found type 'PackedSequence'").
    theirs, ours, _ = packing_twins(mode, options)
    scripted = torch.jit.script(ours)
    with torch.no_grad():
        for lengths in ([3, 7, 1, 6], [2, 2], [4]):
            x, lengths, h0 = packing_inputs(options, lengths)
            got, want = scripted(x, lengths, h0), theirs(x, lengths, h0)
            for what, g, w in zip(("packed output", "final states", "padded output"), got, want):
                assert_close(g, w, f"{what}, lengths {lengths.tolist()}")
    assert "rnnc::forward" in str(scripted.inlined_graph)


def test_a_scripted_packing_model_trains_with_torchs_gradients():
    theirs, ours, _ = packing_twins("GRU", dict(num_layers=2, bidirectional=True))
    scripted = torch.jit.script(ours)
    x, lengths, h0 = packing_inputs(dict(num_layers=2, bidirectional=True), [5, 2, 4])
    for model in (theirs, scripted):
        model.zero_grad()
        y, h_n, _ = model(x, lengths, h0)
        (y.pow(2).sum() + h_n.sum()).backward()
    for (name, want), got in zip(theirs.rnn.named_parameters(), ours.rnn.parameters()):
        assert_close(got.grad, want.grad, f"gradient of {name}", 1e-4)


class ScriptableRecurrentPacking(torch.nn.Module):
    """A scripted model giving rnnc.nn.Recurrent a PackedSequence (its side input padded, laid
    out as the padded x), and the padded batch in the same model."""

    def __init__(self, layer, batch_first):
        super().__init__()
        self.layer, self.batch_first = layer, batch_first

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, h0: torch.Tensor,
                context: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        packed = pack_padded_sequence(x, lengths, self.batch_first, enforce_sorted=False)
        out, finals = self.layer(packed, {"h": h0}, None, {"context": context})
        padded, _ = pad_packed_sequence(out, self.batch_first,
                                        total_length=x.size(1 if self.batch_first else 0))
        whole, _ = self.layer(x, {"h": h0}, lengths, {"context": context})
        return padded, finals["h"], whole


@pytest.mark.parametrize("batch_first", [False, True])
def test_a_scripted_model_gives_a_recurrent_cell_a_packed_sequence(batch_first):
    # Was refused: the scripted forward was typed for a Tensor ("Expected a value of type
    # 'Tensor' for argument 'x' but instead found type 'PackedSequence'").
    torch.manual_seed(15)
    layer = rnnc.nn.Recurrent(GATED_WITH_CONTEXT, num_layers=2, bidirectional=True,
                              batch_first=batch_first, input_size=6, context_size=2,
                              hidden_size=5).eval()
    model = ScriptableRecurrentPacking(layer, batch_first)
    scripted = torch.jit.script(model)
    for lengths in ([3, 7, 1, 6], [2, 2], [4]):
        steps, batch = max(lengths), len(lengths)
        shape = (batch, steps) if batch_first else (steps, batch)
        x, context = torch.randn(*shape, 6), torch.randn(*shape, 2)
        h0, lengths = torch.randn(4, batch, 5), torch.tensor(lengths)
        with torch.no_grad():
            got = scripted(x, lengths, h0, context)
            # the eager layer given both as PackedSequences, the oracle for the packed call
            packed = pack_padded_sequence(x, lengths, batch_first, enforce_sorted=False)
            out, finals = layer(packed, {"h": h0}, context=pack_padded_sequence(
                context, lengths, batch_first, enforce_sorted=False))
            want_y = pad_packed_sequence(out, batch_first, total_length=steps)[0]
        assert_close(got[0], want_y, f"packed output, lengths {lengths.tolist()}")
        assert_close(got[1], finals["h"], f"h_n, lengths {lengths.tolist()}")
        assert_close(got[2], want_y, f"padded output with lengths {lengths.tolist()}")
    assert "rnnc::forward" in str(scripted.inlined_graph)


class PackedGru(torch.nn.Module):
    """A scripted model taking a PackedSequence and handing it to its layer as it is."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, packed: PackedSequence, h0: torch.Tensor,
                lengths: Optional[torch.Tensor] = None) -> Tuple[PackedSequence, torch.Tensor]:
        out, finals = self.layer(packed, {"h": h0}, lengths)
        return out, finals["h"]


def test_a_scripted_recurrent_gru_packs_and_trains_as_torchs_gru():
    theirs, ours = recurrent_gru_twins(16, num_layers=2, bidirectional=True)
    scripted = torch.jit.script(PackedGru(ours))
    x, lengths, h0 = torch.randn(5, 3, 6), torch.tensor([5, 2, 4]), torch.randn(4, 3, 5)
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    got_y, got_h = scripted(packed, h0)
    want_y, want_h = theirs(packed, h0)
    assert torch.equal(got_y.batch_sizes, want_y.batch_sizes)
    assert torch.equal(got_y.unsorted_indices, want_y.unsorted_indices)
    assert_close(got_y.data, want_y.data, "packed output")
    assert_close(got_h, want_h, "h_n")
    (got_y.data.pow(2).sum() + got_h.sum()).backward()
    (want_y.data.pow(2).sum() + want_h.sum()).backward()
    for (name, want), got in zip(theirs.named_parameters(), ours.parameters()):
        assert_close(got.grad, want.grad, f"gradient of {name}", 1e-4)
    with pytest.raises(Exception, match=r"a PackedSequence carries its lengths: give no "
                                        r"lengths"):
        scripted(packed, h0, lengths)
    # Scripted alone, as torch.nn's modules, the layer takes the padded batch.
    alone = torch.jit.script(ours)
    with torch.no_grad():
        y, finals = alone(x, {"h": h0}, lengths)
        assert_close(y, pad_packed_sequence(want_y)[0], "scripted alone, padded")
    assert "forward" not in vars(ours)  # the module itself is unchanged


def test_what_tracing_cannot_record_is_refused_clearly():
    torch.manual_seed(6)
    plain = rnnc.LSTM(6, 8)  # not a torch.nn.Module: its weights are rnnc's own
    with pytest.raises(RuntimeError, match=r"rnnc\.nn\.LSTM"):
        trace(lambda x: plain(x)[0], torch.randn(3, 2, 6))


@pytest.mark.parametrize("mode", ["LSTM", "GRU", "RNN"])
def test_a_layer_scripted_alone_runs_and_shares_its_parameters(mode, tmp_path):
    # torch 1.13's own scripted torch.nn.LSTM has no forward (pytorch/pytorch#32976): its
    # forward is declared for a tensor and a PackedSequence, and compiled only where a caller
    # picks one. rnnc.nn's layers declare the same, and script alone with the tensor's.
    torch.manual_seed(11)
    theirs = getattr(torch.nn, mode)(6, 5, num_layers=2)
    ours = getattr(rnnc.nn, mode)(6, 5, num_layers=2)
    ours.load_state_dict(theirs.state_dict())
    scripted = torch.jit.script(ours)
    x = torch.randn(4, 3, 6)
    with torch.no_grad():
        assert_close(scripted(x)[0], theirs(x)[0], "scripted alone")
        for module in (ours, theirs):
            module.weight_hh_l1.mul_(-0.5)
        assert_close(scripted(x)[0], theirs(x)[0], "after an in-place weight edit")
        torch.jit.save(scripted, tmp_path / "alone.pt")
        assert_close(torch.jit.load(tmp_path / "alone.pt")(x)[0], theirs(x)[0], "loaded")
        packed = pack_padded_sequence(x, torch.tensor([4, 1, 2]), enforce_sorted=False)
        assert_close(ours(packed)[0].data, theirs(packed)[0].data, "the module, eager, packed")
    assert "forward" not in vars(ours)  # the module itself is unchanged


@pytest.mark.parametrize("alone_first", [False, True])
@pytest.mark.parametrize("mode", ["GRU", "Recurrent"])
def test_a_layer_scripts_alone_and_inside_a_model_in_either_order(mode, alone_first):
    # Scripted alone after a model holding it was, the layer had no forward: the model's
    # scripting wrote its overloads into the layer (__overloads__), and the copy scripted alone
    # took them, so TorchScript skipped its forward as overloaded.
    theirs, ours = recurrent_gru_twins(17)
    if mode == "GRU":
        ours = rnnc.nn.GRU(6, 5)
        ours.load_state_dict(theirs.state_dict())
    model = PackedGru(ours) if mode == "Recurrent" else ScriptablePacking(ours, False)
    x, lengths, h0 = torch.randn(5, 3, 6), torch.tensor([5, 2, 4]), torch.randn(1, 3, 5)
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    scripted = {}
    for which in (["alone", "model"] if alone_first else ["model", "alone"]):
        scripted[which] = torch.jit.script(ours if which == "alone" else model)
    with torch.no_grad():
        want_y, want_h = theirs(packed, h0)
        y = scripted["alone"](x, *([h0] if mode == "GRU" else [{"h": h0}]))[0]
        assert_close(y, theirs(x, h0)[0], "scripted alone")
        if mode == "GRU":
            got_y, got_h, _ = scripted["model"](x, lengths, h0)
            assert_close(got_y, pad_packed_sequence(want_y)[0], "scripted model, packed")
        else:
            got_y, got_h = scripted["model"](packed, h0)
            assert_close(got_y.data, want_y.data, "scripted model, packed")
        assert_close(got_h, want_h, "scripted model, h_n")


def test_wrong_shapes_are_named_in_scripted_and_traced_models():
    scripted = torch.jit.script(rnnc.nn.LSTM(6, 8))
    with pytest.raises(Exception, match=r"input has shape \[5, 3, 7\].*input_size = 6"):
        scripted(torch.randn(5, 3, 7))
    with pytest.raises(Exception, match=r"hx\[1\] has shape \[1, 2, 8\], expected \[1, 3, 8\]"):
        scripted(torch.randn(5, 3, 6), (torch.randn(1, 3, 8), torch.randn(1, 2, 8)))
    cell = torch.jit.script(rnnc.nn.GRUCell(6, 8))
    with pytest.raises(Exception, match=r"hx\[0\] has shape \[8\], expected \[2, 8\]"):
        cell(torch.randn(2, 6), torch.randn(8))
    # A traced model checks nothing itself: the operator's error comes as a warning, since the
    # interpreter drops the message of the exception.
    with torch.no_grad():
        traced = trace(rnnc.nn.GRU(6, 8), torch.randn(3, 2, 6))
    with pytest.warns(RuntimeWarning, match=r"rnnc::forward: ValueError: input has shape "
                                            r"\[3, 2, 5\]"):
        with pytest.raises(RuntimeError):
            traced(torch.randn(3, 2, 5))


# ---- dropout in training: the masks drawn per call, as the eager module draws them -----------

DROPPING_CELL = """cell dropping(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w[hidden_size, input_size], u[hidden_size, hidden_size], b[hidden_size]
  h2 = tanh(linear(dropout(x, 0.25), w, b) + linear(h, dropout(u, 0.5)))
  return h = h2; output h2
}"""

DROPPING = [("LSTM", dict(num_layers=2, dropout=0.5, bidirectional=True)),
            ("GRU", dict(num_layers=3, dropout=0.3, batch_first=True)),
            ("Recurrent", dict(cell=DROPPING_CELL, num_layers=2, dropout=0.4))]


class DroppingModel(torch.nn.Module):
    """A layer that drops in training (between layers, or a cell's row and weight dropouts),
    then a sum over its output's features."""

    def __init__(self, mode, options):
        super().__init__()
        options = dict(options)
        self.rnn = rnnc.nn.Recurrent(options.pop("cell"), input_size=6, hidden_size=8,
                                     **options) if mode == "Recurrent" else \
            getattr(rnnc.nn, mode)(6, 8, **options)

    def forward(self, x):
        return self.rnn(x)[0].sum(-1)


@pytest.mark.parametrize("how", ["trace", "script", "script, saved and loaded"])
@pytest.mark.parametrize("mode,options", DROPPING, ids=[m for m, _ in DROPPING])
def test_a_traced_or_scripted_model_in_training_draws_the_eager_modules_masks(mode, options, how,
                                                                              tmp_path):
    # Was refused (scripted) or recorded one mask and the weights as they were (traced). Each
    # call draws its masks from a seed of torch's generator, as the eager call does: under
    # torch.manual_seed, the same masks, so the same outputs and gradients, and new masks at
    # the next call.
    torch.manual_seed(12)
    model = DroppingModel(mode, options)
    x = torch.randn(4, 5, 6) if options.get("batch_first") else torch.randn(5, 4, 6)
    if how == "trace":
        compiled = trace(model, (x,))
    else:
        compiled = torch.jit.script(model)
        if how != "script":
            torch.jit.save(compiled, str(tmp_path / "model.pt"))
            compiled = torch.jit.load(str(tmp_path / "model.pt"))
    results = []
    for run in (model, compiled):
        run.zero_grad()
        torch.manual_seed(99)
        y = run(x)
        (y * y).sum().backward()
        results.append((y.detach(), [p.grad.clone() for p in run.parameters()]))
    assert_close(results[1][0], results[0][0], f"{how}: output")
    for got, want in zip(results[1][1], results[0][1]):
        assert_close(got, want, f"{how}: a gradient")
    with torch.no_grad():
        first, second = compiled(x), compiled(x)
        assert not torch.equal(first, second), "new masks at each call"
        if how == "trace":  # (a trace keeps the mode it was traced in, as torch.nn's do)
            return
        compiled.eval()
        model.eval()
        assert torch.equal(compiled(x), compiled(x)), "no masks in eval mode"
        assert_close(compiled(x), model(x), f"{how}: eval")


class Seeded(torch.nn.Module):
    def __init__(self, layer, seed):
        super().__init__()
        self.layer, self.seed = layer, seed

    def forward(self, x):
        return self.layer(x, seed=self.seed)[0]


def test_a_traced_recurrent_cell_given_a_seed_keeps_it():
    torch.manual_seed(13)
    layer = rnnc.nn.Recurrent(DROPPING_CELL, input_size=6, hidden_size=8)
    x = torch.randn(5, 4, 6)
    traced = trace(Seeded(layer, 77), (x,))
    want = layer(x, seed=77)[0]
    assert torch.equal(traced(x), want) and torch.equal(traced(x), want)
    assert not torch.equal(layer(x, seed=78)[0], want)


def test_a_gradient_penalty_through_a_scripted_dropping_model_is_the_eager_ones():
    torch.manual_seed(14)
    model = DroppingModel("LSTM", dict(num_layers=2, dropout=0.5))
    scripted = torch.jit.script(model)
    x = torch.randn(5, 4, 6)
    results = []
    for run in (model, scripted):
        xs = x.clone().requires_grad_(True)
        torch.manual_seed(100)
        grad_x, = torch.autograd.grad(run(xs).pow(2).sum(), xs, create_graph=True)
        penalty = (grad_x.norm() - 1) ** 2
        results.append(torch.autograd.grad(penalty, [xs, *run.parameters()]))
    for got, want in zip(*reversed(results)):
        assert_close(got, want, "scripted penalty through dropout", 1e-4)
