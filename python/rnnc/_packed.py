"""A layer's padded output as the PackedSequence its input was, in tensor operations only: autograd
flows through it, torch.jit.trace records it for any lengths, and TorchScript compiles it (the
scripted forward of rnnc.nn's modules takes a PackedSequence as torch.nn's do)."""

import torch
from torch import Tensor
from torch.nn.utils.rnn import PackedSequence


def repack(y: Tensor, packed_input: PackedSequence, batch_first: bool) -> PackedSequence:
    """The padded output y (the caller's batch order) laid out as packed_input: step t's rows are
    the first batch_sizes[t] sequences in sorted order, which is y in sorted order masked where a
    sequence has a step, read row by row."""
    batch_sizes = packed_input.batch_sizes
    by_step = y.transpose(0, 1) if batch_first else y  # [T, B, F]
    sorted_indices = packed_input.sorted_indices
    if sorted_indices is not None:
        by_step = by_step.index_select(1, sorted_indices.to(y.device))
    has_step = torch.arange(by_step.size(1)).unsqueeze(0) < batch_sizes.unsqueeze(1)
    return PackedSequence(by_step[has_step], batch_sizes, sorted_indices,
                          packed_input.unsorted_indices)
