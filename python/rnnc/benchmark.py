"""rnnc.bench: a cell's whole-sequence time, fused against unfused, from Python."""

import statistics
import time

import numpy as np

from . import _rnnc

_DEFAULT_SIZES = {"input_size": 512, "hidden_size": 512}


def _timing(run, warmup, repeat):
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1e3)
    return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times),
            "mean_ms": statistics.fmean(times)}


def bench(cell="lstm", seq=100, batch=64, threads=1, repeat=5, warmup=1, interpreter=True,
          **sizes):
    """Times one layer of `cell` (a built-in name, a .cell path or source text) on random data
    and weights, as `rnnc bench` does: the JIT with every pass ("jit"), the JIT without
    elementwise fusion ("jit_no_fuse") and, unless interpreter=False, the reference interpreter
    (unfused). Sizes default to the fastrnns LSTM's (input_size = hidden_size = 512). threads
    as everywhere in rnnc (0: automatic), but 1 by default like `rnnc bench`: a benchmark's
    figure should not depend on how busy the machine was. Returns a
    dict: the setting, {path: {median_ms, min_ms, max_ms, mean_ms}} and fused_speedup (no fuse / fused)."""
    sizes = {**_DEFAULT_SIZES, **{k: int(v) for k, v in sizes.items()}}
    shapes = _rnnc.cell_params(cell, sizes)
    rng = np.random.default_rng(0)
    bound = 1.0 / np.sqrt(sizes.get("hidden_size", 1))
    weights = {name: rng.uniform(-bound, bound, shape).astype(np.float32)
               for name, shape in shapes.items()}
    given = {k: v for k, v in sizes.items() if k != "input_size"}

    def layer(jit, fuse=True):
        return _rnnc.Layer(cell, weights, given, 1, False, False, jit, threads, "", fuse)

    fused = layer(True)
    x = rng.standard_normal((seq, batch, fused.input_size)).astype(np.float32)
    paths = {"jit": fused, "jit_no_fuse": layer(True, fuse=False)}
    if interpreter:
        paths["interpreter"] = layer(False)
    timings = {name: _timing(lambda p=program: p.forward(x, {}, None, {}), warmup, repeat)
               for name, program in paths.items()}
    return {"cell": cell if "{" not in cell else "<cell source>", "T": seq, "B": batch,
            "sizes": sizes, "threads": threads, "paths": timings,
            "fused_speedup": timings["jit_no_fuse"]["median_ms"] / timings["jit"]["median_ms"]}
