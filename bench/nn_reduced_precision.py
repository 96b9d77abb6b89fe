#!/usr/bin/env python3
"""Reduced-precision inference inside a torch model, side by side in one run (medians of
alternating rounds): torch.nn's module in fp32 and dynamically quantized to qint8
(torch.ao.quantization.quantize_dynamic, Debian's PyTorch 1.13 on its oneDNN engine), and
rnnc.nn's module of the same weights with weights_dtype fp32, int8 and bf16, each with its error
against torch's fp32 output (max abs, relative to that output's largest value). 1 thread by
default, the fastrnns default sizes (T=100 B=64 I=H=512).

Run with the module built: PYTHONPATH=build/python /usr/bin/python3 bench/nn_reduced_precision.py"""

import statistics
import time

import torch

import rnnc.nn

import nn_sizes


def engines(mode, sizes, threads):
    torch.manual_seed(0)
    reference = getattr(torch.nn, mode)(sizes.input, sizes.hidden).eval()
    quantized = torch.ao.quantization.quantize_dynamic(
        torch.nn.Sequential(reference), {type(reference)}, dtype=torch.qint8)
    found = {"torch fp32": reference, "torch qint8": quantized}
    for dtype in ("fp32", "int8", "bf16"):
        module = getattr(rnnc.nn, mode)(sizes.input, sizes.hidden, threads=threads,
                                        weights_dtype=dtype).eval()
        module.load_state_dict(reference.state_dict())
        found[f"rnnc.nn {dtype}"] = module
    return found


def main():
    sizes = nn_sizes.parse(__doc__, rounds=7)
    torch.set_num_threads(sizes.threads)
    x = torch.randn(sizes.seq, sizes.batch, sizes.input)
    for mode in sizes.modes.split(","):
        found = engines(mode, sizes, sizes.threads)
        times = {name: [] for name in found}
        with torch.inference_mode():
            want = found["torch fp32"](x)[0]
            errors = {name: float((module(x)[0] - want).abs().max() / want.abs().max())
                      for name, module in found.items()}  # (also the warm-up call)
            for _ in range(sizes.rounds):
                for name, module in found.items():
                    start = time.perf_counter()
                    module(x)
                    times[name].append(time.perf_counter() - start)
        median = {name: statistics.median(t) * 1e3 for name, t in times.items()}
        print(f"{mode} T={sizes.seq} B={sizes.batch} I={sizes.input} H={sizes.hidden}, "
              f"{sizes.threads} thread(s), median of {sizes.rounds} alternating rounds:")
        for name in found:
            print(f"  {name:12s} {median[name]:9.2f} ms   error {errors[name]:.1e}")
        int8, fp32 = median["rnnc.nn int8"], median["rnnc.nn fp32"]
        print(f"  rnnc.nn int8 against torch qint8 {median['torch qint8'] / int8:.2f}x, "
              f"against rnnc.nn fp32 {fp32 / int8:.2f}x; "
              f"bf16 against fp32 {fp32 / median['rnnc.nn bf16']:.2f}x")


if __name__ == "__main__":
    main()
