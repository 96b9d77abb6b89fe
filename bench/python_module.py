#!/usr/bin/env python3
"""What the Python module adds to a call, measured side by side in one run (medians):
  - call overhead: rnnc.LSTM(64, 64) at T=1 B=1, numpy and torch in, against the same layer's
    C++ calls timed in C++ (the arguments converted and the layer run, as a C++ caller does);
    target: at most 10 us more;
  - throughput at the fastrnns default (T=100 B=64 I=H=512, 1 thread): the Python call against
    the C++ call; target: within 3%.
Run with the module built: PYTHONPATH=build/python /usr/bin/python3 bench/python_module.py"""

import argparse
import statistics
import time

import numpy as np

import rnnc

try:
    import torch
except ImportError:
    torch = None


def python_calls(call, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def measure(module, x, repeats, rounds):
    """Medians (s) of the Python call (numpy, torch) and the native call, alternating rounds."""
    layer = module._layer()
    module(x)  # compiled, caches warm
    samples = {"python, numpy in": [], "C++ (same layer)": []}
    xt = torch.from_numpy(x) if torch is not None else None
    if xt is not None:
        samples["python, torch in"] = []
    for _ in range(rounds):
        samples["python, numpy in"] += python_calls(lambda: module(x), repeats)
        if xt is not None:
            samples["python, torch in"] += python_calls(lambda: module(xt), repeats)
        samples["C++ (same layer)"] += layer.time_native(x, {}, repeats)
    return {name: statistics.median(values) for name, values in samples.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)

    small = rnnc.LSTM(64, 64, threads=1).eval()
    x_small = rng.standard_normal((1, 1, 64)).astype(np.float32)
    report("call overhead, LSTM T=1 B=1 I=H=64, 1 thread (median us per call)",
           measure(small, x_small, 2000, args.rounds), scale=1e6,
           excess=lambda t, native: t - native, limit=10e-6,
           show=lambda e: f"+{e * 1e6:.2f} us", target="at most 10 us above C++")
    print()
    big = rnnc.LSTM(512, 512, threads=1).eval()
    x_big = rng.standard_normal((100, 64, 512)).astype(np.float32)
    report("throughput, LSTM T=100 B=64 I=H=512 (the fastrnns default), 1 thread (median ms)",
           measure(big, x_big, 3, args.rounds), scale=1e3,
           excess=lambda t, native: t / native - 1, limit=0.03,
           show=lambda e: f"{100 * e:+.1f}%", target="within 3% of C++")


def report(title, times, scale, excess, limit, show, target):
    """One table: each Python path's median against the C++ call's, and the target's verdict."""
    native = times["C++ (same layer)"]
    print(title)
    for name, t in times.items():
        extra = "" if name.startswith("C++") else "   " + show(excess(t, native))
        print(f"  {name:<22}{t * scale:9.2f}{extra}")
    worst = max(excess(t, native) for n, t in times.items() if not n.startswith("C++"))
    print(f"  target: {target}: {'met' if worst <= limit else 'NOT met'} ({show(worst)})")

if __name__ == "__main__":
    main()
