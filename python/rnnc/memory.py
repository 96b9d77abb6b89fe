"""The memory rnnc keeps for reuse, as torch.cuda's caching allocator keeps GPU memory.

Buffers of 128 KB and more (tensors, packed weights, a run's workspace, a training step's records
and gradients) are not returned to the system when freed but kept for the next buffer of their
size: a layer called again, or the next training step, then meets no page faults. At most
``memory_cache_limit()`` bytes are kept (a gigabyte unless set); the oldest go first.

    rnnc.memory_cached()               # bytes kept now
    rnnc.empty_cache()                 # returns them to the system; the bytes
    rnnc.set_memory_cache_limit(0)     # keep none from now on (returns the bytes let go)
"""

from . import _rnnc


def memory_cached():
    """The bytes of freed buffers rnnc keeps for reuse."""
    return _rnnc.memory_cached()


def empty_cache():
    """Returns every buffer kept to the system (as torch.cuda.empty_cache); the bytes freed."""
    return _rnnc.empty_cache()


def memory_cache_limit():
    """The most bytes kept (a gigabyte unless set)."""
    return _rnnc.memory_cache_limit()


def set_memory_cache_limit(bytes):
    """Keeps at most `bytes` (0: none) from now on, freeing the oldest beyond it; the bytes freed."""
    return _rnnc.set_memory_cache_limit(int(bytes))
