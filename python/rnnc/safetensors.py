"""Weights files: rnnc reads safetensors (F32, or I8 with per-row scales) and writes them.

    rnnc.save_safetensors(torch.nn.LSTM(512, 512).state_dict(), "lstm.safetensors")
    rnnc.save_int8(torch.nn.LSTM(512, 512).state_dict(), "lstm-int8.safetensors")
    weights = rnnc.load_safetensors("lstm-int8.safetensors")   # {name: float32 array}
    weights = rnnc.load_weights("model.pt")   # torch.save's file, read without torch

save_safetensors is what `rnnc run --weights` and `rnnc grad` need from a PyTorch module without
the safetensors package (Debian does not ship it).

An int8 file holds each weight matrix NAME as I8 with NAME.scale (F32, one scale per row: the
output channel) beside it, the weight being q * scale; other tensors (biases) stay F32. rnnc
reads it as fp32 weights; with weights_dtype="int8" (``--weights-dtype int8``) it quantizes them
again per row with scale = max|w| / 127, which gives back the same integers when the file's
scales are that (as save_int8 writes them, and as torch.quantize_per_channel does with those
scales).
"""

import json
import os

import numpy as np

from . import _rnnc


def load_safetensors(path):
    """Every tensor of a safetensors file as float32 numpy arrays (int8 ones dequantized)."""
    return _rnnc.read_safetensors(os.fspath(path))


def load_weights(path, prefix=None):
    """The float32 numpy arrays of a weight file, without torch: safetensors, or what torch.save
    wrote (a state_dict, or a checkpoint nesting one, tensors named by the keys on their way:
    ``model.rnn.weight_ih_l0``; float64, float16 and bfloat16 converted, integer tensors and
    everything else skipped). With ``prefix``, only the tensors whose names start with it, under
    the rest of their names (``prefix="model.rnn."`` gives a layer's state_dict)."""
    arrays = _rnnc.read_weight_file(os.fspath(path))
    if prefix is None:
        return arrays
    selected = {name[len(prefix):]: value for name, value in arrays.items()
                if name.startswith(prefix) and len(name) > len(prefix)}
    if not selected:
        raise ValueError(f"{os.fspath(path)}: no tensor's name starts with {prefix!r}; the file "
                         f"has: {', '.join(sorted(arrays)) or 'nothing'}")
    return selected


def quantize_rows(weight):
    """A float matrix as int8 with one scale per row: scale = max|row| / 127 (1 for a row of
    zeros), q = round-half-even(w / scale) in [-127, 127]."""
    w = np.asarray(weight, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError(f"quantize_rows takes a matrix, not shape {list(w.shape)}")
    scale = (np.abs(w).max(axis=1) / np.float32(127)).astype(np.float32)
    scale[scale == 0] = 1
    q = np.clip(np.rint(w / scale[:, None]), -127, 127).astype(np.int8)
    return q, scale


def _as_array(value):
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def save_safetensors(tensors, path):
    """Writes {name: tensor} (torch tensors or numpy arrays) as a safetensors file: int8 arrays
    as I8, everything else as float32 (F32), little-endian, in C order."""
    arrays = {}
    for name, value in tensors.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"a tensor's name must be a non-empty string, not {name!r}")
        value = _as_array(value)
        arrays[name] = value if value.dtype == np.int8 else value.astype("<f4")
    header, chunks, offset = {}, [], 0
    for name in sorted(arrays):
        data = np.ascontiguousarray(arrays[name]).tobytes()
        padding = (-offset) % 8
        chunks.append(b"\0" * padding + data)
        offset += padding
        header[name] = {"dtype": "I8" if arrays[name].dtype == np.int8 else "F32",
                        "shape": list(arrays[name].shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * ((-len(text)) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(chunks))


def save_int8(state_dict, path):
    """Writes a state_dict (torch tensors or numpy arrays) with every matrix quantized to int8
    per row (quantize_rows) and every other tensor as float32."""
    tensors = {}
    for name, value in state_dict.items():
        value = _as_array(value).astype(np.float32)
        if value.ndim == 2:
            q, scale = quantize_rows(value)
            tensors[name] = q
            tensors[name + ".scale"] = scale
        else:
            tensors[name] = value
    save_safetensors(tensors, path)
