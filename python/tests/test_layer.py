"""rnnc.Layer: any cell from Python, states by name, the IR after every pass, many threads."""

import threading

import numpy as np
import pytest

import rnnc

# A minimal gated unit, written for this test; its reference below is numpy.
MGU = """
cell mgu(input_size, hidden_size) {
  input x[input_size]
  state h[hidden_size]
  param w_f[hidden_size, input_size], u_f[hidden_size, hidden_size], b_f[hidden_size]
  param w_h[hidden_size, input_size], u_h[hidden_size, hidden_size], b_h[hidden_size]
  f = sigmoid(linear(x, w_f, b_f) + linear(h, u_f))
  candidate = tanh(linear(x, w_h, b_h) + linear(f * h, u_h))
  h2 = (1 - f) * h + f * candidate
  return h = h2; output h2
}
"""


def mgu_weights(rng, inputs, hidden):
    def uniform(*shape):
        return rng.uniform(-0.5, 0.5, shape).astype(np.float32)
    return {"w_f": uniform(hidden, inputs), "u_f": uniform(hidden, hidden), "b_f": uniform(hidden),
            "w_h": uniform(hidden, inputs), "u_h": uniform(hidden, hidden), "b_h": uniform(hidden)}


def mgu_reference(w, x, h):
    def sigmoid(v):
        return 1 / (1 + np.exp(-v))
    ys = []
    for x_t in x.astype(np.float64):
        f = sigmoid(x_t @ w["w_f"].T + w["b_f"] + h @ w["u_f"].T)
        candidate = np.tanh(x_t @ w["w_h"].T + w["b_h"] + (f * h) @ w["u_h"].T)
        h = (1 - f) * h + f * candidate
        ys.append(h)
    return np.stack(ys), h


def test_a_cell_from_its_source_text_matches_a_hand_written_reference():
    rng = np.random.default_rng(1)
    weights = mgu_weights(rng, 5, 6)
    layer = rnnc.Layer(MGU)
    layer.load_state_dict(weights)
    x = rng.standard_normal((7, 3, 5)).astype(np.float32)
    h0 = rng.standard_normal((1, 3, 6)).astype(np.float32)
    y, final = layer(x, {"h": h0})
    want_y, want_h = mgu_reference(weights, x, h0[0].astype(np.float64))
    np.testing.assert_allclose(y, want_y, atol=1e-5)
    np.testing.assert_allclose(final["h"][0], want_h, atol=1e-5)
    assert layer.state_names == ["h"]


def test_a_cell_file_and_lengths(tmp_path):
    path = tmp_path / "mgu.cell"
    path.write_text(MGU)
    rng = np.random.default_rng(2)
    weights = mgu_weights(rng, 4, 3)
    layer = rnnc.Layer(path)
    layer.load_state_dict(weights)
    x = rng.standard_normal((5, 2, 4)).astype(np.float32)
    y, final = layer(x, lengths=[5, 2])
    want_y, _ = mgu_reference(weights, x[:2, 1:2], np.zeros((1, 3)))
    np.testing.assert_allclose(y[:2, 1:2], want_y, atol=1e-5)
    assert not y[2:, 1].any()  # zero past its length
    np.testing.assert_allclose(final["h"][0, 1], want_y[-1, 0], atol=1e-5)


def test_builtin_cell_by_name_with_torch_weights():
    torch = pytest.importorskip("torch")
    torch.manual_seed(3)
    module = torch.nn.GRU(4, 5, num_layers=2, bidirectional=True)
    layer = rnnc.Layer("gru", input_size=4, hidden_size=5)
    layer.load_state_dict(module.state_dict())
    x = torch.randn(6, 2, 4)
    h0 = torch.randn(4, 2, 5)
    y, final = layer(x, {"h": h0})
    with torch.no_grad():
        want_y, want_h = module(x, h0)
    assert isinstance(y, torch.Tensor)
    np.testing.assert_allclose(y.numpy(), want_y.numpy(), atol=1e-5)
    np.testing.assert_allclose(final["h"].numpy(), want_h.numpy(), atol=1e-5)


def test_ir_after_every_pass_and_one_pass():
    layer = rnnc.Layer("lstm", input_size=8, hidden_size=16)
    everything = layer.ir(after="all")
    for name in ["simplify", "premultiply", "sink-slices", "fuse", "fuse-matmul"]:
        assert f"IR after {name}" in everything
    assert "[B, 64]" in everything  # the sizes given are bound
    optimised = layer.ir()
    assert optimised.startswith("cell @lstm") and "fused {" in optimised
    assert "IR after" not in optimised
    assert "IR after premultiply" in layer.ir(after="premultiply")
    assert "IR after fuse " not in layer.ir(after="premultiply")
    with pytest.raises(ValueError, match="no pass named 'nonsense'"):
        layer.ir(after="nonsense")


def test_errors_name_what_is_wrong():
    with pytest.raises(ValueError, match="has no weights"):
        rnnc.Layer("lstm")(np.zeros((2, 1, 3), np.float32))
    with pytest.raises(ValueError, match="<cell source>:"):
        rnnc.Layer("cell broken(n) { input x[n] }").ir()
    with pytest.raises(ValueError, match="lstm"):  # the unknown name lists the built-ins
        rnnc.Layer("no_such_cell").ir()
    layer = rnnc.Layer(MGU)
    layer.load_state_dict(mgu_weights(np.random.default_rng(0), 3, 4))
    with pytest.raises(ValueError, match=r"\[1, 2, 5\]"):
        layer(np.zeros((2, 2, 3), np.float32), {"h": np.zeros((1, 2, 5), np.float32)})


def test_one_layer_serves_many_threads_at_once():
    rng = np.random.default_rng(4)
    layer = rnnc.Layer(MGU)
    layer.load_state_dict(mgu_weights(rng, 16, 32))
    inputs = [rng.standard_normal((20, 4, 16)).astype(np.float32) for _ in range(8)]
    expected = [layer(x)[0] for x in inputs]
    results = [None] * len(inputs)

    def work(i):
        for _ in range(5):
            results[i] = layer(inputs[i])[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for got, want in zip(results, expected):
        np.testing.assert_array_equal(got, want)


def test_builtin_cells_are_listed():
    assert {"lstm", "gru", "rnn_tanh"} <= set(rnnc.builtin_cells())


def test_bench_times_fused_and_unfused_paths():
    result = rnnc.bench("gru", seq=4, batch=2, input_size=8, hidden_size=16, repeat=2)
    assert set(result["paths"]) == {"jit", "jit_no_fuse", "interpreter"}
    for timing in result["paths"].values():
        assert 0 < timing["min_ms"] <= timing["median_ms"] <= timing["max_ms"]
        assert timing["min_ms"] <= timing["mean_ms"] <= timing["max_ms"]
    assert result["fused_speedup"] == pytest.approx(
        result["paths"]["jit_no_fuse"]["median_ms"] / result["paths"]["jit"]["median_ms"])
    assert result["sizes"] == {"input_size": 8, "hidden_size": 16}
    # The C++ side times a call the way a C++ caller makes it: positive, one entry per repeat.
    layer = rnnc.Layer("gru", input_size=8, hidden_size=16)
    layer.load_state_dict({name: np.zeros(shape, np.float32) for name, shape in
                           rnnc._rnnc.cell_params("gru", {"input_size": 8, "hidden_size": 16}).items()})
    seconds = layer._layer().time_native(np.zeros((3, 2, 8), np.float32), {}, 4)
    assert len(seconds) == 4 and min(seconds) > 0


def test_import_rnnc_leaves_torch_unimported_until_it_is_needed():
    """`import rnnc` and numpy runs do not import torch (a second and more of start-up); rnnc.nn
    and state_dict, which give torch modules and tensors, do."""
    import os
    import subprocess
    import sys
    code = """
import sys
import numpy as np
import rnnc
assert "torch" not in sys.modules, "import rnnc imported torch"
lstm = rnnc.LSTM(4, 3)
y, (h, c) = lstm(np.zeros((5, 2, 4), np.float32))
assert isinstance(y, np.ndarray) and y.shape == (5, 2, 3)
assert "torch" not in sys.modules, "a numpy run imported torch"
import torch
assert type(lstm.state_dict()["weight_ih_l0"]) is torch.Tensor
y, _ = lstm(torch.zeros(5, 2, 4))
assert isinstance(y, torch.Tensor)
assert issubclass(rnnc.nn.LSTM, torch.nn.Module)
"""
    done = subprocess.run([sys.executable, "-c", code], env=dict(os.environ), capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr


def test_memory_kept_for_reuse_is_reported_released_and_limited():
    """Freed buffers of 2 MB and more are kept for reuse (a layer's 8 MB of packed weights when it
    goes); rnnc.empty_cache returns them, and a limit of 0 keeps none."""
    import gc

    def run_and_drop():
        lstm = rnnc.LSTM(512, 512)
        y, _ = lstm(np.ones((2, 1, 512), np.float32))
        del lstm
        gc.collect()
        return y

    limit = rnnc.memory_cache_limit()
    try:
        rnnc.empty_cache()
        run_and_drop()
        kept = rnnc.memory_cached()
        assert kept >= 8 << 20
        assert rnnc.empty_cache() == kept
        assert rnnc.memory_cached() == 0
        rnnc.set_memory_cache_limit(0)
        assert rnnc.memory_cache_limit() == 0
        run_and_drop()
        assert rnnc.memory_cached() == 0
        with pytest.raises(ValueError, match="limit must be 0"):
            rnnc.set_memory_cache_limit(-1)
    finally:
        rnnc.set_memory_cache_limit(limit)
    assert rnnc.memory_cache_limit() == limit
