"""PackedSequence out of a padded output, shared by rnnc.LSTM and rnnc.nn.LSTM (torch only)."""


def repack(y, packed_input, batch_first):
    """The padded output y (the caller's batch order) as a PackedSequence laid out as
    packed_input: step t's rows are the first batch_sizes[t] sequences in sorted order.
    Indexing, so autograd flows through it."""
    import torch
    from torch.nn.utils.rnn import PackedSequence

    batch_sizes = packed_input.batch_sizes
    order = packed_input.sorted_indices
    if order is None:
        order = torch.arange(int(batch_sizes[0]))
    steps = torch.repeat_interleave(torch.arange(len(batch_sizes)), batch_sizes)
    sequences = order[torch.cat([torch.arange(int(n)) for n in batch_sizes])]
    data = y[sequences, steps] if batch_first else y[steps, sequences]
    return PackedSequence(data, batch_sizes, packed_input.sorted_indices,
                          packed_input.unsorted_indices)
