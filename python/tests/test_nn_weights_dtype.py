"""rnnc.nn's modules with reduced-precision weights (weights_dtype: fp16, bf16, int8) for
inference: the results of rnnc.LSTM and its kin with the same option (rnnc.from_torch), within
the error bounds against torch's fp32 module (int8: no worse than torch's own dynamic
quantization of the same weights), the option changeable between calls, kept through tracing,
scripting and copies; a call that autograd records is refused with int8 (bf16 and fp16 train:
test_mixed_precision_training.py)."""

import copy
import warnings

import pytest

torch = pytest.importorskip("torch")

import rnnc  # noqa: E402
import rnnc.nn  # noqa: E402

DTYPES = ["fp16", "bf16", "int8"]


def relative_error(ours, theirs):
    return float((ours - theirs).abs().max()) / float(theirs.abs().max())


def twins(mode, **options):
    torch.manual_seed(20)
    theirs = getattr(torch.nn, mode)(32, 48, **options).eval()
    ours = getattr(rnnc.nn, mode)(32, 48, **options).eval()
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def torch_qint8_error(theirs, x, want):
    quantized = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(theirs),
                                                       {type(theirs)}, dtype=torch.qint8)
    with torch.no_grad():
        return relative_error(quantized(x)[0], want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_an_nn_module_runs_reduced_weights_as_rnnc_layers_do(mode, dtype):
    theirs, ours = twins(mode, num_layers=2)
    ours.weights_dtype = dtype
    x = torch.randn(20, 4, 32)
    with torch.no_grad():
        want, got = theirs(x)[0], ours(x)[0]
        fp32 = rnnc.from_torch(theirs)(x)[0]
    same_option = rnnc.from_torch(theirs, weights_dtype=dtype)(x)[0]
    assert torch.equal(got, same_option)
    assert not torch.equal(got, fp32)  # the option reached the program
    error = relative_error(got, want)
    bound = torch_qint8_error(theirs, x, want) if dtype == "int8" else 1e-2
    assert error <= bound, f"{dtype}: error {error:.3g} against {bound:.3g}"


def test_the_option_changes_between_calls_after_training_in_fp32():
    theirs, ours = twins("GRU")
    ours.train()
    optimiser = torch.optim.SGD(ours.parameters(), lr=0.5)
    x = torch.randn(6, 3, 32)
    ours(x)[0].pow(2).sum().backward()
    optimiser.step()
    theirs.load_state_dict(ours.state_dict())
    ours.eval()
    with torch.inference_mode():
        for dtype in ("int8", "fp16", "fp32"):
            ours.weights_dtype = dtype
            want = rnnc.from_torch(theirs, weights_dtype=dtype)(x)[0]
            assert torch.equal(ours(x)[0], want), dtype
        assert torch.allclose(ours(x)[0], theirs(x)[0], atol=1e-5)


def test_a_call_autograd_records_is_refused_with_int8_weights():
    _, ours = twins("LSTM")
    ours.weights_dtype = "int8"
    x = torch.randn(5, 2, 32)
    with pytest.raises(NotImplementedError, match=r"weights_dtype='int8' runs inference only.*"
                                                  r"weights_dtype='bf16' or 'fp16'.*"
                                                  r"torch\.no_grad\(\)"):
        ours(x)
    with torch.no_grad():
        assert ours(x)[0].shape == (5, 2, 48)
    with pytest.raises(ValueError, match=r"weights_dtype must be one of fp32, bf16, fp16, int8, "
                                         r"not 'int4'"):
        ours.weights_dtype = "int4"
    with pytest.raises(ValueError, match=r"not 'fp64'"):
        rnnc.nn.GRU(4, 5, weights_dtype="fp64")


@pytest.mark.parametrize("how", ["trace", "script", "copy"])
def test_tracing_scripting_and_copies_keep_the_option(how):
    theirs, ours = twins("LSTM", bidirectional=True)
    ours.weights_dtype = "int8"
    x = torch.randn(7, 3, 32)
    with torch.no_grad():
        want = rnnc.from_torch(theirs, weights_dtype="int8")(x)[0]
        if how == "trace":
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = torch.jit.trace(ours, (torch.randn(4, 2, 32),))
        elif how == "script":
            model = torch.jit.script(ours)
        else:
            model = copy.deepcopy(ours)
            assert model.weights_dtype == "int8"
        assert torch.equal(model(x)[0], want)


def test_cells_and_custom_cells_take_the_option():
    torch.manual_seed(21)
    theirs = torch.nn.LSTMCell(32, 48)
    ours = rnnc.nn.LSTMCell(32, 48, weights_dtype="fp16")
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(3, 32)
    with torch.no_grad():
        got = ours(x)
        want = rnnc.from_torch(theirs, weights_dtype="fp16")(x)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert relative_error(got[0], theirs(x)[0]) <= 1e-2
    layer = rnnc.nn.Recurrent("gru", input_size=32, hidden_size=48, weights_dtype="int8").eval()
    plain = rnnc.Layer("gru", input_size=32, hidden_size=48, weights_dtype="int8")
    plain.load_state_dict({name.replace("_l0", ""): p for name, p in layer.state_dict().items()})
    x = torch.randn(6, 2, 32)
    with torch.no_grad():
        assert torch.equal(layer(x)[0], plain(x)[0])
