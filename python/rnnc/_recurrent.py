"""What rnnc.LSTM (numpy or torch) and rnnc.nn.LSTM (torch) share: the initial states torch.nn
takes as hx, checked against the shapes it expects, and a PackedSequence out of a padded output."""


def state_shapes(module, lstm, batch):
    """Each state's [num_layers * num_directions, batch, features], by name ("h", and "c")."""
    slots = module.num_layers * (2 if module.bidirectional else 1)
    shapes = {"h": [slots, batch, module.proj_size or module.hidden_size]}
    if lstm:
        shapes["c"] = [slots, batch, module.hidden_size]
    return shapes


def given_states(lstm, hx):
    """hx as torch.nn takes it ((h_0, c_0) for an LSTM, h_0 otherwise) as (name, label, value)."""
    if not lstm:
        return [("h", "hx (h_0)", hx)]
    if not isinstance(hx, (tuple, list)) or len(hx) != 2:
        raise ValueError("LSTM expects hx as a tuple (h_0, c_0)")
    return [("h", "hx[0] (h_0)", hx[0]), ("c", "hx[1] (c_0)", hx[1])]


def check_state_shape(label, shape, expected):
    if list(shape) != list(expected):
        raise ValueError(f"{label} has shape {list(shape)}, expected {list(expected)} "
                         "[num_layers * num_directions, batch, features]")


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
