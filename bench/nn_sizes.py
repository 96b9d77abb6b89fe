"""The command line of the rnnc.nn bench scripts (nn_reduced_precision.py,
nn_mixed_precision_training.py): the modes and sizes, the fastrnns default ones (T=100 B=64
I=H=512), the threads (1) and the alternating rounds whose medians they report."""

import argparse


def parse(doc, rounds):
    """The arguments, the script's docstring's first line its description."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--modes", default="LSTM,GRU")
    parser.add_argument("--seq", type=int, default=100)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--input", type=int, default=512)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=rounds)
    return parser.parse_args()
