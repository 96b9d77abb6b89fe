"""rnnc.LSTM, GRU and RNN against torch.nn: every constructor option, hx given or not,
PackedSequence, unbatched input, numpy and torch in and out, and the errors torch users expect."""

import itertools

import numpy as np
import pytest

import rnnc

torch = pytest.importorskip("torch")
import rnnc.nn  # noqa: E402
from torch.nn.utils.rnn import pack_padded_sequence  # noqa: E402

TOLERANCE = 1e-5


def assert_close(ours, theirs, what):
    ours = ours.detach().numpy() if isinstance(ours, torch.Tensor) else np.asarray(ours)
    theirs = theirs.detach().numpy()
    assert ours.shape == theirs.shape, f"{what}: shape {ours.shape} vs torch's {theirs.shape}"
    scale = max(1.0, float(np.abs(theirs).max()))
    error = float(np.abs(ours - theirs).max()) / scale
    assert error <= TOLERANCE, f"{what}: max error {error:.3g} relative to {scale:.3g}"


def torch_module(mode, *args, **kwargs):
    torch.manual_seed(7)
    module = {"LSTM": torch.nn.LSTM, "GRU": torch.nn.GRU, "RNN_TANH": torch.nn.RNN,
              "RNN_RELU": torch.nn.RNN}[mode]
    if mode == "RNN_RELU":
        kwargs["nonlinearity"] = "relu"
    return module(*args, **kwargs).eval()


def initial_state(mode, module, batch):
    slots = module.num_layers * (2 if module.bidirectional else 1)
    h0 = torch.randn(slots, batch, module.proj_size or module.hidden_size)
    if mode == "LSTM":
        return (h0, torch.randn(slots, batch, module.hidden_size))
    return h0


def compare_outputs(mode, ours, theirs):
    assert_close(ours[0], theirs[0], "output")
    if mode == "LSTM":
        assert_close(ours[1][0], theirs[1][0], "h_n")
        assert_close(ours[1][1], theirs[1][1], "c_n")
    else:
        assert_close(ours[1], theirs[1], "h_n")


OPTIONS = [dict(num_layers=layers, bidirectional=bidirectional, batch_first=batch_first, bias=bias)
           for layers, bidirectional, batch_first, bias
           in itertools.product([1, 2], [False, True], [False, True], [True, False])]


@pytest.mark.parametrize("mode", ["LSTM", "GRU", "RNN_TANH", "RNN_RELU"])
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_same_results_as_torch_for_every_option(mode, options):
    module = torch_module(mode, 5, 7, **options)
    ours = rnnc.from_torch(module)
    steps, batch = 4, 3
    x = torch.randn(batch, steps, 5) if options["batch_first"] else torch.randn(steps, batch, 5)
    with torch.no_grad():
        compare_outputs(mode, ours(x), module(x))
        hx = initial_state(mode, module, batch)
        compare_outputs(mode, ours(x, hx), module(x, hx))


@pytest.mark.parametrize("options", [dict(), dict(num_layers=2, bidirectional=True),
                                     dict(batch_first=True, bias=False)])
def test_lstm_with_projections(options):
    module = torch_module("LSTM", 6, 8, proj_size=3, **options)
    ours = rnnc.from_torch(module)
    x = torch.randn(5, 2, 6) if not options.get("batch_first") else torch.randn(2, 5, 6)
    with torch.no_grad():
        compare_outputs("LSTM", ours(x), module(x))
        hx = initial_state("LSTM", module, 2)
        compare_outputs("LSTM", ours(x, hx), module(x, hx))


@pytest.mark.parametrize("mode", ["LSTM", "GRU", "RNN_TANH"])
@pytest.mark.parametrize("options", [dict(), dict(num_layers=2, bidirectional=True),
                                     dict(batch_first=True)])
def test_packed_sequence_in_gives_packed_sequence_out(mode, options):
    module = torch_module(mode, 4, 6, **options)
    ours = rnnc.from_torch(module)
    lengths = torch.tensor([3, 5, 1, 4])
    padded = torch.randn(4, 5, 4) if options.get("batch_first") else torch.randn(5, 4, 4)
    packed = pack_padded_sequence(padded, lengths, batch_first=options.get("batch_first", False),
                                  enforce_sorted=False)
    hx = initial_state(mode, module, 4)
    with torch.no_grad():
        for args in [(packed,), (packed, hx)]:
            y, final = ours(*args)
            want_y, want_final = module(*args)
            assert isinstance(y, torch.nn.utils.rnn.PackedSequence)
            assert torch.equal(y.batch_sizes, want_y.batch_sizes)
            assert torch.equal(y.sorted_indices, want_y.sorted_indices)
            assert torch.equal(y.unsorted_indices, want_y.unsorted_indices)
            compare_outputs(mode, (y.data, final), (want_y.data, want_final))


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_unbatched_input(mode):
    module = torch_module(mode, 3, 4, num_layers=2)
    ours = rnnc.from_torch(module)
    x = torch.randn(6, 3)
    with torch.no_grad():
        compare_outputs(mode, ours(x), module(x))
        hx = tuple(s[:, 0] for s in initial_state(mode, module, 1)) if mode == "LSTM" \
            else initial_state(mode, module, 1)[:, 0]
        compare_outputs(mode, ours(x, hx), module(x, hx))


def test_numpy_in_numpy_out_and_torch_in_torch_out():
    module = torch_module("GRU", 3, 4)
    ours = rnnc.from_torch(module)
    x = np.random.default_rng(0).standard_normal((5, 2, 3)).astype(np.float32)
    y, h = ours(x)
    assert isinstance(y, np.ndarray) and isinstance(h, np.ndarray)
    assert y.dtype == np.float32 and y.shape == (5, 2, 4)
    y_torch, h_torch = ours(torch.from_numpy(x))
    assert isinstance(y_torch, torch.Tensor) and isinstance(h_torch, torch.Tensor)
    np.testing.assert_array_equal(y, y_torch.numpy())
    # float64 is computed in float32 and comes back as float64, as torch.nn answers in its input's
    # type (torch tensors too: below).
    y64, h64 = ours(x.astype(np.float64))
    assert y64.dtype == np.float64 and h64.dtype == np.float64
    np.testing.assert_allclose(y64, y, rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_results_come_back_in_the_inputs_type(dtype):
    """A float64 or bfloat16 model: rnnc computes in float32, and the next layer of the model
    gets its own type back, as from torch.nn."""
    dtype = getattr(torch, dtype)
    module = torch_module("LSTM", 3, 4, num_layers=2, bidirectional=True)
    x = torch.randn(5, 2, 3)
    with torch.no_grad():
        want_y, (want_h, want_c) = module(x)
        outputs = [rnnc.from_torch(module)(x.to(dtype)),
                   rnnc.from_torch(module)(pack_padded_sequence(x.to(dtype), [5, 3])),
                   rnnc.nn.LSTM(3, 4, num_layers=2, bidirectional=True).to(dtype)]
        outputs[2].load_state_dict(module.state_dict())
        outputs[2] = outputs[2].eval()(x.to(dtype))
        layer = rnnc.Layer("lstm")
        layer.load_state_dict(module.state_dict())
        y, finals = layer(x.to(dtype))
        outputs.append((y, (finals["h"], finals["c"])))
    tolerance = 1e-5 if dtype == torch.float64 else 2e-2  # bfloat16's own rounding of x and y
    for i, (y, (h, c)) in enumerate(outputs):
        y = y.data if isinstance(y, torch.nn.utils.rnn.PackedSequence) else y
        assert y.dtype == dtype and h.dtype == dtype and c.dtype == dtype, f"call {i}"
        if i != 1:  # the packed call ran shorter sequences
            assert float((y.float() - want_y).abs().max()) <= tolerance, f"call {i}"
            assert float((c.float() - want_c).abs().max()) <= tolerance, f"call {i}"


def test_other_dtypes_and_shapes_are_rejected_clearly():
    ours = rnnc.from_torch(torch_module("LSTM", 3, 4, num_layers=2))
    with pytest.raises(TypeError, match="int64"):
        ours(torch.ones(5, 2, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"input.*\[5, 2, 9\].*3|3.*\[5, 2, 9\]"):
        ours(torch.randn(5, 2, 9))
    h0, c0 = torch.zeros(2, 2, 4), torch.zeros(2, 2, 4)
    with pytest.raises(ValueError, match=r"h_0.*\[1, 2, 4\].*\[2, 2, 4\]"):
        ours(torch.randn(5, 2, 3), (torch.zeros(1, 2, 4), c0))
    with pytest.raises(ValueError, match=r"c_0.*\[2, 2, 5\].*\[2, 2, 4\]"):
        ours(torch.randn(5, 2, 3), (h0, torch.zeros(2, 2, 5)))
    with pytest.raises(ValueError, match="4D"):
        ours(torch.randn(5, 2, 3, 1))
    with pytest.raises(ValueError, match=r"weight_hh_l0.*\[16, 5\].*\[16, 4\]"):
        ours.load_state_dict({**ours.state_dict(), "weight_hh_l0": torch.zeros(16, 5)})
    with pytest.raises(KeyError, match="weight_ih_l1"):
        ours.load_state_dict({"weight_ih_l0": torch.zeros(16, 3)})


def test_constructor_checks_as_torch():
    with pytest.raises(ValueError, match="proj_size"):
        rnnc.GRU(3, 4, proj_size=2)
    with pytest.raises(ValueError, match="proj_size"):
        rnnc.LSTM(3, 4, proj_size=4)
    with pytest.raises(ValueError, match="nonlinearity"):
        rnnc.RNN(3, 4, nonlinearity="sigmoid")
    with pytest.raises(ValueError, match="dropout"):
        rnnc.LSTM(3, 4, dropout=1.5)


def test_own_initial_weights_and_state_dict_round_trip():
    ours = rnnc.LSTM(3, 4, num_layers=2, bidirectional=True, proj_size=2)
    module = torch.nn.LSTM(3, 4, num_layers=2, bidirectional=True, proj_size=2).eval()
    assert list(ours.state_dict()) == list(module.state_dict())
    bound = 1 / 2  # 1/sqrt(hidden_size)
    assert all(float(v.abs().max()) <= bound for v in ours.state_dict().values())
    module.load_state_dict(ours.state_dict())
    x = torch.randn(4, 2, 3)
    with torch.no_grad():
        compare_outputs("LSTM", ours(x), module(x))


@pytest.mark.parametrize("how", ["deepcopy", "pickle", "torch.save"])
def test_a_module_copies_as_torch_modules_do(how, tmp_path):
    """copy.deepcopy, pickle and torch.save of a model holding the module (after a call, so that
    it holds a compiled program): the copy runs as the original, and its weights are its own."""
    import copy
    import pickle

    module = torch_module("GRU", 3, 4, num_layers=2, bidirectional=True)
    ours = rnnc.from_torch(module)
    model = {"encoder": ours, "note": "a model as a user keeps one"}
    x = torch.randn(5, 2, 3)
    before = ours(x)
    if how == "deepcopy":
        copied = copy.deepcopy(model)
    elif how == "pickle":
        copied = pickle.loads(pickle.dumps(model))
    else:
        torch.save(model, tmp_path / "model.pt")
        copied = torch.load(tmp_path / "model.pt")
    twin = copied["encoder"]
    assert type(twin) is rnnc.GRU and repr(twin) == repr(ours)
    with torch.no_grad():
        compare_outputs("GRU", twin(x), module(x))
    twin.load_state_dict({name: value * 2 for name, value in twin.state_dict().items()})
    compare_outputs("GRU", ours(x), before)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_layer_copies_with_its_weights(how):
    import copy
    import pickle

    module = torch_module("LSTM", 3, 4)
    layer = rnnc.Layer("lstm", weights_dtype="fp16")
    layer.load_state_dict(module.state_dict())
    x = torch.randn(5, 2, 3)
    y, finals = layer(x)
    twin = copy.deepcopy(layer) if how == "deepcopy" else pickle.loads(pickle.dumps(layer))
    y2, finals2 = twin(x)
    assert torch.equal(y2, y) and torch.equal(finals2["c"], finals["c"])
    assert twin.weights_dtype == "fp16"


def test_dropout_between_layers_in_training_mode_is_refused_and_eval_runs():
    module = torch_module("LSTM", 3, 4, num_layers=2, dropout=0.5)
    ours = rnnc.from_torch(module).train()
    with pytest.raises(NotImplementedError, match=r"\.eval\(\) first, or train with rnnc\.nn\.LSTM"):
        ours(torch.randn(4, 2, 3))
    ours.eval()
    with torch.no_grad():
        compare_outputs("LSTM", ours(torch.ones(4, 2, 3)), module(torch.ones(4, 2, 3)))


def test_from_torch_takes_only_recurrent_modules():
    with pytest.raises(TypeError, match="Linear"):
        rnnc.from_torch(torch.nn.Linear(3, 4))


def test_repr_names_the_options():
    assert repr(rnnc.LSTM(3, 4, num_layers=2, batch_first=True)) == \
        "rnnc.LSTM(3, 4, num_layers=2, batch_first=True)"


def bf16_product_reference(mode, module, x):
    """The layers written out in torch ops, every matrix product multiplying operands rounded to
    bf16 (inputs, states and weights) and summing in fp32, as rnnc's bf16 products do; biases and
    the elementwise math in fp32. No hx: zero initial states. Returns (output, h_n[, c_n])."""
    def bf16(t):
        return t.to(torch.bfloat16).float()

    def product(rows, weight):
        return bf16(rows) @ bf16(weight).t()

    hidden = module.hidden_size
    directions = 2 if module.bidirectional else 1
    layer_input, finals_h, finals_c = x, [], []
    for layer in range(module.num_layers):
        outputs = []
        for direction in range(directions):
            suffix = f"_l{layer}" + ("_reverse" if direction else "")
            w_ih, w_hh = getattr(module, "weight_ih" + suffix), getattr(module, "weight_hh" + suffix)
            b_ih, b_hh = getattr(module, "bias_ih" + suffix), getattr(module, "bias_hh" + suffix)
            h = torch.zeros(x.shape[1], hidden)
            c = torch.zeros(x.shape[1], hidden)
            steps = range(x.shape[0] - 1, -1, -1) if direction else range(x.shape[0])
            out = [None] * x.shape[0]
            for t in steps:
                gi = product(layer_input[t], w_ih) + b_ih
                gh = product(h, w_hh) + b_hh
                if mode == "LSTM":
                    i, f, g, o = (gi + gh).chunk(4, 1)
                    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                    h = torch.sigmoid(o) * torch.tanh(c)
                elif mode == "GRU":
                    ir, iz, inn = gi.chunk(3, 1)
                    hr, hz, hn = gh.chunk(3, 1)
                    r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)
                    n = torch.tanh(inn + r * hn)
                    h = (1 - z) * n + z * h
                else:
                    h = torch.tanh(gi + gh)
                out[t] = h
            outputs.append(torch.stack(out))
            finals_h.append(h)
            finals_c.append(c)
        layer_input = torch.cat(outputs, 2)
    if mode == "LSTM":
        return layer_input, (torch.stack(finals_h), torch.stack(finals_c))
    return layer_input, torch.stack(finals_h)


@pytest.mark.parametrize("mode", ["LSTM", "GRU", "RNN_TANH"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_reduced_weights_match_torch_on_rounded_operands(mode, dtype):
    module = torch_module(mode, 9, 12, num_layers=2, bidirectional=True)
    ours = rnnc.from_torch(module, weights_dtype=dtype)
    x = torch.randn(6, 3, 9)
    with torch.no_grad():
        exact = module(x)
        got = ours(x)
        if dtype == "bf16":  # products of bf16 inputs and bf16 weights
            reference = bf16_product_reference(mode, module, x)
        else:
            # fp16 weights, fp32 inputs: torch rounds the matrices (not the biases) the same
            # way, to nearest even.
            for name, parameter in module.named_parameters():
                if name.startswith("weight"):
                    parameter.copy_(parameter.half().float())
            reference = module(x)
    compare_outputs(mode, got, reference)
    error = float((got[0] - exact[0]).abs().max()) / float(exact[0].abs().max())
    assert 0 < error < 1e-2, f"{dtype} weights: error {error:.3g} against fp32"


def test_an_unknown_weights_dtype_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown weights dtype 'fp8': expected fp32, bf16, fp16 or int8"):
        rnnc.LSTM(4, 5, weights_dtype="fp8")(np.zeros((2, 1, 4), np.float32))


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
@pytest.mark.parametrize("seed", [0, 1])
def test_int8_weights_are_at_least_as_accurate_as_torch_dynamic_quantization(mode, seed):
    """The issue's bound: rnnc's int8 error (against fp32) no worse than PyTorch's qint8 on the
    same weights and inputs; per-column weight and per-row input scales make it smaller."""
    torch.manual_seed(seed)
    module = getattr(torch.nn, mode)(64, 96, num_layers=2).eval()
    # quantize_dynamic swaps submodules, not the module it is given.
    theirs = torch.ao.quantization.quantize_dynamic(
        torch.nn.Sequential(module), {torch.nn.LSTM, torch.nn.GRU}, dtype=torch.qint8)[0]
    ours = rnnc.from_torch(module, weights_dtype="int8")
    x = torch.rand(30, 8, 64) * 2 - 1
    with torch.no_grad():
        exact, their_output, our_output = module(x)[0], theirs(x)[0], ours(x)[0]
    ours_error, their_error = (our_output - exact).abs(), (their_output - exact).abs()
    assert 0 < float(ours_error.max()) <= float(their_error.max())
    assert float(ours_error.mean()) <= float(their_error.mean())


def test_an_int8_file_gives_the_int8_layer_of_its_float_weights(tmp_path):
    """save_int8 writes I8 weights with per-row scales; rnnc reads them as q * scale, and its
    int8 layer on them is the int8 layer of the float weights (the same integers)."""
    module = torch_module("LSTM", 10, 16, num_layers=2)
    path = tmp_path / "lstm-int8.safetensors"
    rnnc.save_int8(module.state_dict(), path)
    loaded = rnnc.load_safetensors(path)
    assert sorted(loaded) == sorted(module.state_dict())
    for name, value in module.state_dict().items():
        value = value.numpy()
        if value.ndim == 2:
            q, scale = rnnc.quantize_rows(value)
            np.testing.assert_array_equal(loaded[name], q.astype(np.float32) * scale[:, None])
            assert np.abs(loaded[name] - value).max() <= scale.max() / 2 * 1.0001
        else:
            np.testing.assert_array_equal(loaded[name], value)
    x = torch.randn(5, 3, 10)
    from_file = rnnc.LSTM(10, 16, num_layers=2, weights_dtype="int8")
    from_file.load_state_dict(loaded)
    from_float = rnnc.from_torch(module, weights_dtype="int8")
    np.testing.assert_allclose(from_file(x)[0].numpy(), from_float(x)[0].numpy(), atol=1e-5)


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_device_option(mode):
    """device="cuda-emulated" runs the GPU's kernels on this CPU (torch's results, packed
    sequences included); an unknown device, and "cuda" without a GPU, are clear errors."""
    module = torch_module(mode, 5, 7, num_layers=2, bidirectional=True)
    ours = rnnc.from_torch(module, device="cuda-emulated")
    lengths = torch.tensor([2, 4, 3])
    padded = torch.randn(4, 3, 5)
    packed = pack_padded_sequence(padded, lengths, enforce_sorted=False)
    hx = initial_state(mode, module, 3)
    with torch.no_grad():
        compare_outputs(mode, ours(padded, hx), module(padded, hx))
        y, final = ours(packed, hx)
        want_y, want_final = module(packed, hx)
        compare_outputs(mode, (y.data, final), (want_y.data, want_final))
    with pytest.raises(ValueError, match="device must be"):
        rnnc.from_torch(module, device="tpu")(padded)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA|GPU"):
            rnnc.from_torch(module, device="cuda")(padded)


def test_a_state_dict_saved_as_safetensors_runs_as_torch_in_the_module_and_the_tool(tmp_path):
    """save_safetensors writes a PyTorch state_dict the way `rnnc run --weights` reads it (Debian
    has no safetensors package): every tensor back bit for bit through rnnc's reader, and the
    layer on it, in the module and in the rnnc tool where the build has one, torch's."""
    import json
    import os
    import pathlib
    import subprocess
    module = torch_module("GRU", 8, 16, num_layers=2, bidirectional=True)
    path = tmp_path / "gru.safetensors"
    rnnc.save_safetensors(module.state_dict(), path)
    raw = path.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    assert length % 8 == 0
    header = json.loads(raw[8:8 + length])
    assert {header[name]["dtype"] for name in header} == {"F32"}
    loaded = rnnc.load_safetensors(path)
    assert sorted(loaded) == sorted(module.state_dict())
    for name, value in module.state_dict().items():
        assert header[name]["shape"] == list(value.shape)
        np.testing.assert_array_equal(loaded[name], value.numpy())
    x = torch.randn(5, 3, 8)
    with torch.no_grad():
        expected = module(x)[0].numpy()
    layer = rnnc.GRU(8, 16, num_layers=2, bidirectional=True)
    layer.load_state_dict(loaded)
    np.testing.assert_allclose(layer(x)[0].numpy(), expected, atol=1e-5)
    # The tool of the build this module comes from (build/python/rnnc -> build/tools/rnnc).
    tool = pathlib.Path(rnnc.__file__).resolve().parents[2] / "tools" / "rnnc"
    if not tool.exists():
        pytest.skip(f"no rnnc tool at {tool}")
    np.save(tmp_path / "x.npy", x.numpy())
    done = subprocess.run([str(tool), "run", "--cell", "gru", "--weights", str(path), "--input",
                           str(tmp_path / "x.npy"), "--num-layers", "2", "--bidirectional",
                           "--output", str(tmp_path / "y.npy")],
                          env=dict(os.environ), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), expected, atol=1e-5)


def test_save_safetensors_refuses_a_name_that_is_not_a_string(tmp_path):
    with pytest.raises(ValueError, match="name"):
        rnnc.save_safetensors({3: np.zeros(2, np.float32)}, tmp_path / "bad.safetensors")


def test_a_checkpoint_saved_by_torch_loads_without_torch(tmp_path):
    """rnnc.load_weights reads torch.save's file in a process that cannot import torch (a
    deployment with numpy and rnnc only): the layer selected by prefix gives torch's results."""
    import os
    import subprocess
    import sys
    module = torch_module("LSTM", 6, 8, num_layers=2, proj_size=3)
    torch.save({"model": {"encoder." + k: v for k, v in module.state_dict().items()},
                "epoch": 4, "step": torch.tensor(17)}, tmp_path / "checkpoint.pt")
    x = torch.randn(5, 2, 6)
    with torch.no_grad():
        np.save(tmp_path / "expected.npy", module(x)[0].numpy())
    np.save(tmp_path / "x.npy", x.numpy())
    script = f"""
import sys
sys.modules["torch"] = None  # importing torch now fails
import numpy as np, rnnc
weights = rnnc.load_weights({str(tmp_path / 'checkpoint.pt')!r}, prefix="model.encoder.")
assert all(type(v) is np.ndarray and v.dtype == np.float32 for v in weights.values())
layer = rnnc.LSTM(6, 8, num_layers=2, proj_size=3)
layer.load_state_dict(weights)
y, _ = layer(np.load({str(tmp_path / 'x.npy')!r}))
np.testing.assert_allclose(y, np.load({str(tmp_path / 'expected.npy')!r}), atol=1e-5)
try:
    rnnc.load_weights({str(tmp_path / 'checkpoint.pt')!r}, prefix="decoder.")
except ValueError as e:
    assert "model.encoder.weight_ih_l0" in str(e), e
else:
    raise AssertionError("an unknown prefix was accepted")
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)), timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
