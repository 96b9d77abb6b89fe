"""rnnc from Python: JIT-compiled recurrent layers.

``rnnc.LSTM``, ``rnnc.GRU`` and ``rnnc.RNN`` take torch.nn's constructor arguments and
state_dict, and are called like torch.nn's modules; ``rnnc.Layer`` runs any cell (a built-in
name, a ``.cell`` file or the cell's source text) with its states by name. Tensors in give
tensors out: torch in, torch out; numpy in, numpy out.

    import rnnc, torch
    lstm = rnnc.from_torch(torch.nn.LSTM(512, 512, num_layers=2))
    y, (h_n, c_n) = lstm(torch.randn(100, 64, 512))

``rnnc.LSTMCell``, ``GRUCell`` and ``RNNCell`` are torch.nn's one-step cells, for loops that
step a cell themselves (a decoder feeding back its output).

``rnnc.nn.LSTM``, ``GRU`` and ``RNN`` are torch.nn's modules trained through rnnc: their forward
and backward are rnnc's (a torch.autograd.Function).
"""

from . import _rnnc
from ._rnnc import __version__, builtin_cells
from .benchmark import bench
from .cells import GRUCell, LSTMCell, RNNCell
from .layers import GRU, LSTM, RNN, Layer, from_torch
from .memory import empty_cache, memory_cache_limit, memory_cached, set_memory_cache_limit
from .safetensors import (load_safetensors, load_weights, quantize_rows, save_int8,
                          save_safetensors)


def __getattr__(name):
    """rnnc.nn (torch modules trained through rnnc) is imported on first use: it imports torch,
    which takes over a second, and `import rnnc` should not."""
    if name == "nn":
        import importlib

        return importlib.import_module(".nn", __name__)
    raise AttributeError(f"module 'rnnc' has no attribute {name!r}")

__all__ = ["LSTM", "GRU", "RNN", "LSTMCell", "GRUCell", "RNNCell", "Layer", "from_torch", "bench",
           "builtin_cells", "__version__", "load_safetensors", "load_weights", "save_int8",
           "save_safetensors", "quantize_rows", "empty_cache", "memory_cached", "memory_cache_limit",
           "set_memory_cache_limit"]
