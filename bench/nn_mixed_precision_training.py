#!/usr/bin/env python3
"""Mixed-precision training inside a torch model, side by side in one run (medians of
alternating rounds): one training step (forward, the loss's backward) of torch.nn's module in fp32
and under torch.autocast("cpu", torch.bfloat16), and of rnnc.nn's module of the same weights with
weights_dtype fp32 and bf16, each with its gradients' error against torch's fp32 ones (the worst
parameter's max abs error over its own largest value). 1 thread by default, the fastrnns default
sizes (T=100 B=64 I=H=512).

Run with the module built:
PYTHONPATH=build/python /usr/bin/python3 bench/nn_mixed_precision_training.py"""

import contextlib
import statistics
import time

import torch

import rnnc.nn

import nn_sizes


def engines(mode, sizes, threads):
    """name -> (module, the context it runs in)."""
    torch.manual_seed(0)
    reference = getattr(torch.nn, mode)(sizes.input, sizes.hidden)
    found = {"torch fp32": (reference, contextlib.nullcontext),
             "torch autocast bf16": (reference,
                                     lambda: torch.autocast("cpu", dtype=torch.bfloat16))}
    for dtype in ("fp32", "bf16"):
        module = getattr(rnnc.nn, mode)(sizes.input, sizes.hidden, threads=threads,
                                        weights_dtype=dtype)
        module.load_state_dict(reference.state_dict())
        found[f"rnnc.nn {dtype}"] = (module, contextlib.nullcontext)
    return found


def step(module, context, x, grad_y):
    """One training step's forward and backward; the parameters' gradients."""
    module.zero_grad()
    with context():
        y, _ = module(x)
    y.float().backward(grad_y)
    return [p.grad for p in module.parameters()]


def worst_error(grads, want):
    return max(float((g - w).abs().max() / w.abs().max()) for g, w in zip(grads, want))


def main():
    sizes = nn_sizes.parse(__doc__, rounds=5)
    torch.set_num_threads(sizes.threads)
    x = torch.randn(sizes.seq, sizes.batch, sizes.input)
    grad_y = torch.randn(sizes.seq, sizes.batch, sizes.hidden)
    for mode in sizes.modes.split(","):
        found = engines(mode, sizes, sizes.threads)
        want = [g.clone() for g in step(*found["torch fp32"], x, grad_y)]
        errors = {name: worst_error(step(module, context, x, grad_y), want)
                  for name, (module, context) in found.items()}  # (also the warm-up step)
        times = {name: [] for name in found}
        for _ in range(sizes.rounds):
            for name, (module, context) in found.items():
                start = time.perf_counter()
                step(module, context, x, grad_y)
                times[name].append(time.perf_counter() - start)
        median = {name: statistics.median(t) * 1e3 for name, t in times.items()}
        print(f"{mode} T={sizes.seq} B={sizes.batch} I={sizes.input} H={sizes.hidden}, "
              f"{sizes.threads} thread(s), forward + backward, median of {sizes.rounds} "
              "alternating rounds:")
        for name in found:
            print(f"  {name:20s} {median[name]:9.2f} ms   gradient error {errors[name]:.1e}")
        bf16 = median["rnnc.nn bf16"]
        print(f"  rnnc.nn bf16 against rnnc.nn fp32 {median['rnnc.nn fp32'] / bf16:.2f}x, "
              f"torch fp32 {median['torch fp32'] / bf16:.2f}x, "
              f"torch autocast bf16 {median['torch autocast bf16'] / bf16:.2f}x")


if __name__ == "__main__":
    main()
