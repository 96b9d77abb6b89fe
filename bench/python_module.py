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
    small_times = measure(small, x_small, 2000, args.rounds)
    native = small_times["C++ (same layer)"]
    print("call overhead, LSTM T=1 B=1 I=H=64, 1 thread (median us per call)")
    for name, t in small_times.items():
        extra = "" if name.startswith("C++") else f"   +{(t - native) * 1e6:.2f} us"
        print(f"  {name:<22}{t * 1e6:9.2f}{extra}")
    worst = max(t for n, t in small_times.items() if not n.startswith("C++")) - native
    print(f"  target: at most 10 us above C++: {'met' if worst <= 10e-6 else 'NOT met'} "
          f"(+{worst * 1e6:.2f} us)\n")

    big = rnnc.LSTM(512, 512, threads=1).eval()
    x_big = rng.standard_normal((100, 64, 512)).astype(np.float32)
    big_times = measure(big, x_big, 3, args.rounds)
    native = big_times["C++ (same layer)"]
    print("throughput, LSTM T=100 B=64 I=H=512 (the fastrnns default), 1 thread (median ms)")
    for name, t in big_times.items():
        extra = "" if name.startswith("C++") else f"   {100 * (t / native - 1):+.1f}%"
        print(f"  {name:<22}{t * 1e3:9.2f}{extra}")
    worst = max(t for n, t in big_times.items() if not n.startswith("C++")) / native - 1
    print(f"  target: within 3% of C++: {'met' if worst <= 0.03 else 'NOT met'} "
          f"({100 * worst:+.1f}%)")


if __name__ == "__main__":
    main()
