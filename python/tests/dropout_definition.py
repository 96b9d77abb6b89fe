"""rnnc's dropout masks written out from their definition (runtime/exec/Hash.h), in plain Python
integers: the tests' oracle for the masks the runtime draws."""

import torch

_MASK64 = (1 << 64) - 1


def _splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _kept(p):
    return float(torch.tensor(1.0 / (1.0 - p), dtype=torch.float32))


def dropout_mask(seed, stream, rows, cols, p):
    """A cell dropout's mask rows: element (row, column) of dropout `stream` is kept, as
    1 / (1 - p), where the hash of (seed, stream, row, column) lands at or above p."""
    mask = torch.empty(len(rows), cols, dtype=torch.float64)
    for i, row in enumerate(rows):
        row_hash = _splitmix64(_splitmix64(_splitmix64(seed) ^ stream) ^ row)
        for c in range(cols):
            u = (_splitmix64(row_hash ^ c) >> 11) * 2.0**-53
            mask[i, c] = 0.0 if u < p else _kept(p)
    return mask


def between_layers_mask(seed, layer, shape, p):
    """The mask between layer `layer` and the next: element i of its output [T, B, W] (time-
    major) kept where the hash of (seed, layer, i) lands at or above p."""
    layer_hash = _splitmix64(seed ^ (layer << 40))
    values = [0.0 if (_splitmix64(layer_hash ^ i) >> 11) * 2.0**-53 < p else _kept(p)
              for i in range(shape[0] * shape[1] * shape[2])]
    return torch.tensor(values, dtype=torch.float64).reshape(shape)
