#!/usr/bin/env python3
"""Training a cell stepped by a loop (a decoder fed its own outputs), rnnc.nn's cells against
torch.nn's with the same weights, side by side in one run: per iteration, a loop of --steps calls,
the loss's backward and an SGD step, 1 thread; the engines alternate, each figure the median of
--rounds rounds of --repeats timed iterations (after one untimed). rnnc's speedup is torch's time
over rnnc's.

Run with the module built: PYTHONPATH=build/python /usr/bin/python3 bench/cell_training.py"""

import argparse
import platform
import statistics
import time

import torch

import rnnc.nn

CONFIGS = [("LSTMCell", 1, 256), ("LSTMCell", 1, 1024), ("LSTMCell", 32, 512),
           ("GRUCell", 1, 256), ("GRUCell", 32, 512), ("RNNCell", 1, 1024)]


def iteration(cell, optimiser, xs):
    """One training iteration: the loop, its backward, the optimiser's step."""
    optimiser.zero_grad()
    state, loss = None, 0
    for x in xs:
        state = cell(x) if state is None else cell(x, state)
        h = state[0] if isinstance(state, tuple) else state
        loss = loss + h.sum()
    loss.backward()
    optimiser.step()


def times(cell, xs, repeats):
    optimiser = torch.optim.SGD(cell.parameters(), lr=1e-4)
    iteration(cell, optimiser, xs)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        iteration(cell, optimiser, xs)
        samples.append(time.perf_counter() - start)
    return samples


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"CPU: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"1 thread, {args.steps} steps per iteration; medians over {args.rounds} rounds of "
          f"{args.repeats} iterations")
    print("| cell | batch | hidden | torch.nn ms | rnnc.nn ms | rnnc speedup |")
    print("|---|---:|---:|---:|---:|---:|")
    for kind, batch, hidden in CONFIGS:
        torch.manual_seed(0)
        theirs = getattr(torch.nn, kind)(hidden, hidden)
        ours = getattr(rnnc.nn, kind)(hidden, hidden, threads=1)
        ours.load_state_dict(theirs.state_dict())
        xs = torch.randn(args.steps, batch, hidden)
        samples = {"torch": [], "rnnc": []}
        for _ in range(args.rounds):
            samples["torch"] += times(theirs, xs, args.repeats)
            samples["rnnc"] += times(ours, xs, args.repeats)
        t, r = (statistics.median(samples[k]) * 1e3 for k in ("torch", "rnnc"))
        print(f"| {kind} | {batch} | {hidden} | {t:.2f} | {r:.2f} | {t / r:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
