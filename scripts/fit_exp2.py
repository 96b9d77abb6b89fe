#!/usr/bin/env python3
"""Fits the degree-5 polynomial for 2^f, f in [-1/2, 1/2], that codegen/VectorMath.cpp uses
inside sigmoid and tanh: p(f) = 1 + f q(f), q of degree 4, so that p(0) is exactly 1. Lawson's
iteration (reweighted least squares) approaches the minimax fit of the relative error; the
script prints the coefficients rounded to float and the error of evaluating p in float with
fused multiply-adds. Needs numpy (Debian's python3-numpy); not part of the build."""
import numpy as np

DEGREE = 4  # of q

f = np.linspace(-0.5, 0.5, 20001)
f = f[f != 0]
target = (np.exp2(f) - 1) / f
powers = np.vstack([f**k for k in range(DEGREE + 1)]).T
scale = np.abs(f) / np.exp2(f)  # turns an error in q into a relative error in p
weights = np.ones_like(f)
for _ in range(200):
    coefficients, *_ = np.linalg.lstsq(powers * (weights * scale)[:, None],
                                       target * weights * scale, rcond=None)
    error = np.abs((powers @ coefficients - target) * scale)
    weights = np.maximum(np.sqrt(weights * error / (weights * error).mean()), 1e-12)
print(f"max relative error in double: {error.max():.3g}")

c32 = coefficients.astype(np.float32)
x = np.linspace(-0.5, 0.5, 2000001).astype(np.float32)
q = np.full_like(x, c32[DEGREE])
for k in range(DEGREE - 1, -1, -1):  # Horner with fma: exact product, one rounding
    q = (q.astype(np.float64) * x + np.float64(c32[k])).astype(np.float32)
p = (q.astype(np.float64) * x + 1.0).astype(np.float32)
relative = np.abs(p.astype(np.float64) / np.exp2(x.astype(np.float64)) - 1)
print(f"max relative error in float: {relative.max():.3g}")
print("q, highest power first:", ", ".join(f"{c:.9e}f" for c in c32[::-1]))
