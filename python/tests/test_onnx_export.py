"""torch.onnx.export of rnnc.nn's modules: ONNX has LSTM, GRU and RNN operators of its own, and the
exporter maps torch.nn's forward onto them, so an rnnc.nn module exports as torch.nn's module of
the same weights does, byte for byte; a traced model records rnnc::forward, whose ONNX symbolic
gives the same operators and weights (there is no ONNX runtime here to run the graph; torch's own
export is the oracle)."""

import io
import textwrap
import warnings

import pytest

torch = pytest.importorskip("torch")

import rnnc.nn  # noqa: E402
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence  # noqa: E402

MODULES = [("LSTM", dict(num_layers=2, bidirectional=True), (3, 2, 4)),
           ("GRU", dict(batch_first=True), (2, 3, 4)),
           ("RNN", dict(nonlinearity="relu", num_layers=2), (3, 2, 4)),
           ("LSTMCell", {}, (2, 4)), ("GRUCell", {}, (2, 4)), ("RNNCell", {}, (2, 4))]


class Tagger(torch.nn.Module):
    """A model as users export them: a recurrent module, then a linear head on its output."""

    def __init__(self, library, mode, **options):
        super().__init__()
        self.rnn = getattr(library, mode)(4, 5, **options)
        directions = 2 if options.get("bidirectional") else 1
        self.head = torch.nn.Linear(5 * directions, 3)

    def forward(self, x):
        out = self.rnn(x)
        return self.head(out[0] if isinstance(out, tuple) else out)


def varint(data, at):
    value, shift = 0, 0
    while True:
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if byte < 0x80:
            return value, at


def fields(message):
    """A protobuf message's fields in order, (number, value): bytes where length-delimited."""
    found, at = [], 0
    while at < len(message):
        key, at = varint(message, at)
        wire = key & 7
        if wire == 0:
            value, at = varint(message, at)
        elif wire == 2:
            size, at = varint(message, at)
            value, at = message[at:at + size], at + size
        else:
            size = {1: 8, 5: 4}[wire]
            value, at = message[at:at + size], at + size
        found.append((key >> 3, value))
    return found


def onnx_graph(model):
    """An ONNX model's operators in order (without Casts) and its weights' bytes, sorted: the
    ModelProto's graph (7), its nodes (1) by op_type (4), its initializers (5) by raw_data (9)."""
    graph = next(value for number, value in fields(model) if number == 7)
    operators = [next(v for n, v in fields(node) if n == 4).decode()
                 for number, node in fields(graph) if number == 1]
    weights = sorted(next((v for n, v in fields(tensor) if n == 9), b"")
                     for number, tensor in fields(graph) if number == 5)
    return [op for op in operators if op != "Cast"], weights


def export(model, shape):
    onnx = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.randn(*shape),), onnx, input_names=["x"],
                          output_names=["y"], dynamic_axes={"x": {0: "d0", 1: "d1"}})
    return onnx.getvalue()


@pytest.mark.parametrize("mode,options,shape", MODULES, ids=[m for m, _, _ in MODULES])
def test_a_model_exports_to_onnx_as_with_torchs_module(mode, options, shape):
    # Was refused: "ONNX export failed on an operator with unrecognized namespace
    # 'rnnc::forward'" (the trace records rnnc's operator, which has no ONNX form).
    torch.manual_seed(14)
    theirs = Tagger(torch.nn, mode, **options).eval()
    ours = Tagger(rnnc.nn, mode, **options).eval()
    ours.load_state_dict(theirs.state_dict())
    exported = export(ours, shape)
    assert exported == export(theirs, shape)
    if not mode.endswith("Cell"):  # (torch exports a cell as its products and activations)
        assert f"{mode}".encode() in exported, f"no ONNX {mode} operator"
    # The module runs rnnc again once the export is over.
    x = torch.randn(*shape)
    with torch.no_grad():
        assert torch.allclose(ours(x), theirs(x), atol=1e-5)


@pytest.mark.parametrize("mode,options", [(m, o) for m, o, _ in MODULES[:3]],
                         ids=[m for m, _, _ in MODULES[:3]])
def test_a_traced_model_exports_its_operator_as_torchs_recurrent_operators(mode, options):
    # A traced model holds rnnc::forward itself: its ONNX symbolic maps the built-in cells onto
    # ONNX's LSTM, GRU and RNN as torch's symbolic maps torch.nn's (it only adds a Cast to
    # float32 of the input, as rnnc's forward casts it).
    torch.manual_seed(15)
    theirs = Tagger(torch.nn, mode, **options).eval()
    ours = Tagger(rnnc.nn, mode, **options).eval()
    ours.load_state_dict(theirs.state_dict())
    shape = (2, 3, 4) if options.get("batch_first") else (3, 2, 4)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = [torch.jit.trace(model, (torch.randn(*shape),)) for model in (ours, theirs)]
    ours_graph, theirs_graph = (onnx_graph(export(model, shape)) for model in traced)
    assert ours_graph[0] == theirs_graph[0] and mode in ours_graph[0]
    assert ours_graph[1] == theirs_graph[1]  # the same weights, laid out as ONNX's operator's


def twins(mode, **options):
    torch.manual_seed(17)
    theirs = Tagger(torch.nn, mode, **options).eval()
    ours = Tagger(rnnc.nn, mode, **options).eval()
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


@pytest.mark.parametrize("mode,options,shape", MODULES[:4], ids=[m for m, _, _ in MODULES[:4]])
def test_a_scripted_model_exports_as_torchs_scripted_model(mode, options, shape):
    # Was refused: the scripted forward built rnnc::forward's lists in loops, which the exporter
    # turned into ONNX Loops that no symbolic reads.
    theirs, ours = twins(mode, **options)
    ours_graph = onnx_graph(export(torch.jit.script(ours), shape))
    theirs_graph = onnx_graph(export(torch.jit.script(theirs), shape))
    operator = mode.replace("Cell", "")
    assert operator in ours_graph[0] and operator in theirs_graph[0]
    if not mode.endswith("Cell"):  # (the cell's reshapes of its one step differ from torch's)
        assert ours_graph[0] == theirs_graph[0]
    assert ours_graph[1] == theirs_graph[1]


@pytest.mark.parametrize("mode", ["GRUCell", "RNNCell"])
def test_scripted_cells_export_as_onnxs_recurrent_operators(mode):
    # torch 1.13 cannot export its own scripted GRUCell or RNNCell (aten::gru_cell and
    # aten::rnn_tanh_cell have no symbolic); rnnc's step is ONNX's GRU or RNN over one step,
    # with the weights torch's export gives a one-layer torch.nn module of the same weights.
    torch.manual_seed(18)
    cell = getattr(rnnc.nn, mode)(4, 5).eval()
    layer = getattr(torch.nn, mode.replace("Cell", ""))(4, 5).eval()
    layer.load_state_dict({f"{name}_l0": value for name, value in cell.state_dict().items()})
    class Step(torch.nn.Module):
        def __init__(self, cell):
            super().__init__()
            self.cell = cell

        def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
            return self.cell(x, h)

    exported = {}
    for name, model, args in (("cell", torch.jit.script(Step(cell)),
                               (torch.randn(2, 4), torch.zeros(2, 5))),
                              ("layer", layer, (torch.randn(3, 2, 4), torch.zeros(1, 2, 5)))):
        exported[name] = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, args, exported[name])
    operators, weights = onnx_graph(exported["cell"].getvalue())
    assert mode.replace("Cell", "") in operators
    assert weights == onnx_graph(exported["layer"].getvalue())[1]


def test_what_onnx_has_no_operator_for_is_refused_by_name():
    class Custom(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = rnnc.nn.Recurrent(textwrap.dedent("""\
                cell leaky(input_size, hidden_size) {
                  input x[input_size]
                  state h[hidden_size]
                  param w[hidden_size, input_size]
                  return h = 0.5 * h + tanh(linear(x, w)); output h
                }"""), input_size=4, hidden_size=5)

        def forward(self, x):
            return self.layer(x)[0]

    x = torch.randn(3, 2, 4)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        custom = torch.jit.trace(Custom().eval(), (x,))
        with pytest.raises(Exception, match=r"rnnc::forward, the cell 'leaky' in a traced or "
                                            r"scripted model \(ONNX's recurrent operators"):
            torch.onnx.export(custom, (x,), io.BytesIO())


def nodes(model):
    """An ONNX model's nodes in order, (op_type, inputs, outputs), and its graph's inputs' names:
    NodeProto's input (1), output (2), op_type (4); GraphProto's node (1), input (11)."""
    graph = next(value for number, value in fields(model) if number == 7)
    found = []
    for number, node in fields(graph):
        if number == 1:
            parts = fields(node)
            found.append((next(v for n, v in parts if n == 4).decode(),
                          [v.decode() for n, v in parts if n == 1],
                          [v.decode() for n, v in parts if n == 2]))
    inputs = [next(v for n, v in fields(value) if n == 1).decode()
              for number, value in fields(graph) if number == 11]
    return found, inputs


@pytest.mark.parametrize("mode", ["GRU", "LSTM"])
def test_lengths_in_a_traced_model_are_the_operators_sequence_lens(mode):
    # Was refused ("rnnc::forward, sequence lengths"): a traced model running a layer on a
    # padded batch of several lengths exports them as ONNX's sequence_lens, int32, as torch's
    # exporter gives a packed batch's.
    class Packing(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = rnnc.nn.Recurrent(mode.lower(), bidirectional=True, input_size=4,
                                           hidden_size=5)

        def forward(self, x, lengths):
            return self.layer(x, lengths=lengths)[0]

    x, lengths = torch.randn(3, 2, 4), torch.tensor([3, 1])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = Packing().eval()
        traced = torch.jit.trace(model, (x, lengths))
        onnx = io.BytesIO()
        torch.onnx.export(traced, (x, lengths), onnx, input_names=["x", "lengths"])
        assert torch.equal(traced(x, lengths), model(x, lengths))
    found, inputs = nodes(onnx.getvalue())
    assert inputs[:2] == ["x", "lengths"]
    recurrent = [(ins, outs) for op, ins, outs in found if op == mode]
    assert len(recurrent) == 1
    sequence_lens = recurrent[0][0][4]  # X, W, R, B, sequence_lens
    assert sequence_lens != "", "no sequence_lens"
    made_by = {out: (op, ins) for op, ins, outs in found for out in outs}
    # sequence_lens is a Cast to int32 of what the trace made of the lengths.
    op, cast_inputs = made_by[sequence_lens]
    assert op == "Cast"
    reached, frontier = set(), list(cast_inputs)
    while frontier:
        name = frontier.pop()
        reached.add(name)
        frontier.extend(made_by.get(name, ("", []))[1])
    assert "lengths" in reached


class Output(torch.nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x):
        return self.layer(x)[0]


def test_a_recurrent_built_in_cell_exports_as_torchs_module():
    # Was refused: "rnnc.nn.Recurrent has no ONNX form".
    torch.manual_seed(19)
    theirs = torch.nn.GRU(4, 5, bidirectional=True)
    ours = rnnc.nn.Recurrent("gru", bidirectional=True, input_size=4, hidden_size=5)
    ours.load_state_dict(theirs.state_dict())
    ours_graph = onnx_graph(export(Output(ours).eval(), (3, 2, 4)))
    theirs_graph = onnx_graph(export(Output(theirs).eval(), (3, 2, 4)))
    assert "GRU" in ours_graph[0]
    assert ours_graph == theirs_graph


class Packing(torch.nn.Module):
    """A model packing its padded batch around the layer, as torch.nn's users write them."""

    def __init__(self, layer, given_h0):
        super().__init__()
        self.layer, self.given_h0 = layer, given_h0

    def forward(self, x, lengths):
        packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
        if not self.given_h0:
            y = self.layer(packed)[0]
        elif isinstance(self.layer, rnnc.nn.Recurrent):
            y = self.layer(packed, {"h": torch.ones(2, x.shape[1], 5)})[0]
        else:
            y = self.layer(packed, torch.ones(2, x.shape[1], 5))[0]
        return pad_packed_sequence(y, total_length=x.shape[0])[0]


@pytest.mark.parametrize("cell,given_h0", [("gru", False), ("lstm", False), ("gru", True)])
def test_a_recurrent_cell_given_a_packed_sequence_exports_as_torchs_module(cell, given_h0):
    # Was an exporter error ("individual pack_padded_sequence or pad_packed_sequence"): the
    # layer unpacked the batch and packed it again. Under export it runs torch's packed
    # recurrence, the pattern the exporter turns into ONNX's operator with sequence_lens.
    torch.manual_seed(21)
    theirs = getattr(torch.nn, cell.upper())(4, 5, bidirectional=True)
    ours = rnnc.nn.Recurrent(cell, bidirectional=True, input_size=4, hidden_size=5)
    ours.load_state_dict(theirs.state_dict())
    x, lengths = torch.randn(3, 2, 4), torch.tensor([3, 1])
    graphs = []
    for layer in (theirs, ours):
        model = Packing(layer, given_h0).eval()
        onnx = io.BytesIO()
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (x, lengths), onnx, input_names=["x", "lengths"])
        graphs.append(onnx_graph(onnx.getvalue()))
    assert cell.upper() in graphs[1][0]
    # The same operators and weights; an LSTM's two zero initial states take a zero constant
    # each where torch's export shares one (the ONNX files otherwise byte for byte alike).
    operators = [[op for op in graph[0] if op != "Constant"] for graph in graphs]
    assert operators[1] == operators[0] and graphs[1][1] == graphs[0][1]
    if cell == "gru":
        assert graphs[1] == graphs[0]
    with torch.no_grad():  # (and it runs as torch's outside export)
        assert torch.allclose(Packing(ours, given_h0)(x, lengths),
                              Packing(theirs, given_h0)(x, lengths), atol=1e-5)
    # A state the cell does not have is named, whether the layer runs or exports.
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    with pytest.raises(ValueError, match="the cell has no state q; its states: h"):
        ours(packed, {"q": torch.zeros(2, 2, 5)})
    if cell == "gru":
        class Unknown(torch.nn.Module):
            def forward(self, x, lengths):
                packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
                return ours(packed, {"q": torch.zeros(2, 2, 5)})[0].data

        with pytest.raises(ValueError, match="the cell has no state q"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(Unknown().eval(), (x, lengths), io.BytesIO())


def test_a_custom_cell_exports_its_operations_unrolled():
    # Any other cell exports as its IR in torch's operations (_torch_cell.py, which
    # test_second_derivatives checks against rnnc's forward), one step after the other over the
    # example's steps, as a hand-written torch loop would export.
    torch.manual_seed(20)
    leaky = textwrap.dedent("""\
        cell leaky(input_size, hidden_size) {
          input x[input_size]
          state h[hidden_size]
          param w[hidden_size, input_size]
          h2 = 0.5 * h + tanh(linear(x, w))
          return h = h2; output h2
        }""")
    layer = rnnc.nn.Recurrent(leaky, bidirectional=True, input_size=4, hidden_size=5)
    with pytest.warns(torch.jit.TracerWarning, match="unrolled over the example's 3 steps"):
        torch.onnx.export(Output(layer).eval(), (torch.randn(3, 2, 4),), io.BytesIO())
    operators, weights = onnx_graph(export(Output(layer).eval(), (3, 2, 4)))
    assert operators.count("Tanh") == 3 * 2  # steps x directions
    for name, param in layer.named_parameters():
        forms = {param.detach().numpy().tobytes(), param.detach().T.contiguous().numpy().tobytes()}
        assert forms & set(weights), f"{name} is not among the ONNX file's weights"
    dropping = rnnc.nn.Recurrent(leaky, num_layers=2, dropout=0.5, input_size=4, hidden_size=5)
    with pytest.raises(RuntimeError, match="exports in eval mode"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(Output(dropping), (torch.randn(3, 2, 4),), io.BytesIO(),
                              training=torch.onnx.TrainingMode.PRESERVE)
    with pytest.raises(RuntimeError, match="give this one x padded"):  # ONNX has no such op
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(Packing(layer, False).eval(),
                              (torch.randn(3, 2, 4), torch.tensor([3, 1])), io.BytesIO())
