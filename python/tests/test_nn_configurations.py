"""rnnc.nn.LSTM, GRU and RNN over random configurations (layers, directions, batch_first, bias,
projections, nonlinearity, unbatched input, float64, given or absent hx, packed batches of random
lengths), each called eagerly, scripted alone and, packed, through a scripted model, against
torch.nn's module of the same weights: the corners the targeted tests do not combine."""

import random
import warnings
from typing import Optional, Tuple

import pytest

torch = pytest.importorskip("torch")

import rnnc.nn  # noqa: E402
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence  # noqa: E402


class PackedLstm(torch.nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, packed: PackedSequence, hx: Optional[Tuple[torch.Tensor, torch.Tensor]]
                ) -> Tuple[PackedSequence, Tuple[torch.Tensor, torch.Tensor]]:
        return self.layer(packed, hx)


class PackedHidden(torch.nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, packed: PackedSequence, hx: Optional[torch.Tensor]
                ) -> Tuple[PackedSequence, torch.Tensor]:
        return self.layer(packed, hx)


def tensors(result):
    """The output (a PackedSequence's data) and every final state."""
    y, finals = result
    return [y.data if hasattr(y, "batch_sizes") else y] + \
        (list(finals) if isinstance(finals, tuple) else [finals])


def configuration(rng):
    mode = rng.choice(["LSTM", "GRU", "RNN"])
    options = dict(num_layers=rng.choice([1, 2]), bidirectional=rng.random() < 0.5,
                   batch_first=rng.random() < 0.5, bias=rng.random() < 0.8)
    if mode == "LSTM" and rng.random() < 0.4:
        options["proj_size"] = 3
    if mode == "RNN":
        options["nonlinearity"] = rng.choice(["tanh", "relu"])
    return mode, options


@pytest.mark.parametrize("seed", range(4))
def test_random_configurations_give_torchs_results_eager_scripted_and_packed(seed):
    rng = random.Random(seed)
    for trial in range(10):
        mode, options = configuration(rng)
        torch.manual_seed(100 * seed + trial)
        theirs = getattr(torch.nn, mode)(4, 5, **options).eval()
        ours = getattr(rnnc.nn, mode)(4, 5, **options).eval()
        ours.load_state_dict(theirs.state_dict())
        dtype = rng.choice([torch.float32, torch.float64])
        theirs.to(dtype)
        steps, batch = rng.randint(1, 6), rng.randint(1, 4)
        unbatched = rng.random() < 0.25
        shape = ((steps, 4) if unbatched else
                 (batch, steps, 4) if options["batch_first"] else (steps, batch, 4))
        x = torch.randn(*shape, dtype=dtype)
        slots = options["num_layers"] * (2 if options["bidirectional"] else 1)
        hx = None
        if rng.random() < 0.5:
            batch_shape = () if unbatched else (batch,)
            h0 = torch.randn(slots, *batch_shape, options.get("proj_size", 5), dtype=dtype)
            c0 = torch.randn(slots, *batch_shape, 5, dtype=dtype)
            hx = (h0, c0) if mode == "LSTM" else h0
        what = f"trial {trial}: {mode} {options}, x {shape} {dtype}, hx given: {hx is not None}"
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            calls = [("eager", theirs(x, hx), ours(x, hx)),
                     ("scripted", theirs(x, hx), torch.jit.script(ours)(x, hx))]
            if not unbatched:
                lengths = torch.tensor([rng.randint(1, steps) for _ in range(batch)])
                packed = pack_padded_sequence(x, lengths, options["batch_first"],
                                              enforce_sorted=False)
                holder = (PackedLstm if mode == "LSTM" else PackedHidden)(ours)
                calls += [("packed", theirs(packed, hx), ours(packed, hx)),
                          ("packed, scripted", theirs(packed, hx),
                           torch.jit.script(holder)(packed, hx))]
        for how, want, got in calls:
            for index, (w, g) in enumerate(zip(tensors(want), tensors(got))):
                assert g.shape == w.shape and g.dtype == w.dtype, f"{what}, {how}, result {index}"
                assert float((g - w).abs().max()) <= 1e-4, f"{what}, {how}, result {index}"
