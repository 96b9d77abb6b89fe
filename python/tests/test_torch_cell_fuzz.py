"""Random valid cells (the C++ fuzzer's generator, `fuzz_cells --print`) in torch's operations
(_torch_cell.py, what a second derivative and an ONNX export of rnnc.nn.Recurrent run): the
forward against rnnc's interpreter, and the first derivatives of the recorded backward
(create_graph=True) against the backward rnnc derives, over 2 layers, both directions and
lengths (1 layer where a side input shares the input's width, which a stack changes); in
training too, with the dropout masks the call drew."""

import itertools
import os
import re
import subprocess
import warnings

import pytest

torch = pytest.importorskip("torch")

import rnnc  # noqa: E402
import rnnc.nn  # noqa: E402
from rnnc._torch_cell import ir_recurrence  # noqa: E402

# In the build tree, the package sits in build/python/rnnc and the fuzzer in build/tests/fuzz.
FUZZER = os.path.join(os.path.dirname(rnnc.__file__), "..", "..", "tests", "fuzz", "fuzz_cells")


def random_cells(seed, count, cache_dir):
    if not os.path.exists(FUZZER):
        pytest.skip("fuzz_cells is not built beside this rnnc package")
    printed = subprocess.run([FUZZER, "--count", str(count), "--seed", str(seed), "--print",
                              "--target-cpu", ""], capture_output=True, text=True, check=True,
                             env=dict(os.environ, RNNC_CACHE_DIR=str(cache_dir))).stdout
    return re.findall(r"(cell fuzz\(.*?\n\})", printed, re.S)


def relative(got, want):
    got = torch.zeros(()) if got is None else got
    want = torch.zeros(()) if want is None else want
    return float((got - want).abs().max()) / (float(want.abs().max()) + 1e-6)


def agrees_with_rnnc(source, index, what, seed=None):
    """The torch form of random cell `source` against rnnc's interpreter: the forward, and the
    first derivatives of the recorded backward (create_graph=True) against rnnc's; 2 layers
    and both directions where the cell stacks, lengths. `seed`: in training, the call's
    (its dropouts', and 0.3 between layers, drawn by both as rnnc draws them); None: eval."""
    sizes = {name: 4 for name in re.search(r"cell fuzz\(([^)]*)\)", source)[1].split(", ")}
    sizes.update(input_size=5, hidden_size=6)
    declared = dict(re.findall(r"(\w+)\[([^\]]+)\]", re.search(r"input (.*)", source)[1]))
    stacked = all("input_size" not in width for name, width in declared.items() if name != "x")
    layout = dict(num_layers=2, bidirectional=True) if stacked else {}
    if stacked and seed is not None:
        layout["dropout"] = 0.3
    torch.manual_seed(index)
    layer = rnnc.nn.Recurrent(source, jit=False, **layout, **sizes).train(seed is not None)
    x, lengths = torch.randn(4, 3, 5, requires_grad=True), [4, 1, 3]
    sides = {name: torch.randn(4, 3, eval(declared[name], {}, dict(sizes)))
             for name in layer.side_input_names}
    with torch.no_grad():
        want_y, want_finals = layer(x, lengths=torch.tensor(lengths), seed=seed, **sides)
        forward = ir_recurrence(source, sizes, layer._input_size, layout.get("num_layers", 1),
                                layout.get("bidirectional", False), False, lengths,
                                None if seed is None else (seed, layout.get("dropout", 0.0)))
        y, finals = forward(x, [None] * len(layer.state_sizes), list(sides.values()),
                            list(layer.parameters()))
    assert relative(y, want_y) <= 1e-4, f"{what}: output"
    for name, got in zip(layer.state_sizes, finals):
        assert relative(got, want_finals[name]) <= 1e-4, f"{what}: final {name}"
    grads = []
    for create_graph in (False, True):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            y = layer(x, lengths=torch.tensor(lengths), seed=seed, **sides)[0]
            weights = torch.linspace(-1, 1, y.shape[-1])
            grads.append(torch.autograd.grad((y * weights).sum(), [x, *layer.parameters()],
                                             create_graph=create_graph, allow_unused=True))
    for got, want in zip(*reversed(grads)):
        assert relative(got, want) <= 1e-3, f"{what}: a first derivative"


def test_random_cells_in_torchs_operations_run_and_differentiate_as_rnnc(tmp_path):
    cells = random_cells(4840, 40, tmp_path)
    assert len(cells) == 40
    for index, source in enumerate(cells):
        agrees_with_rnnc(source, index, f"cell {index} of fuzz_cells --seed 4840")


def test_random_cells_in_mixed_precision_run_as_rnncs_interpreter(tmp_path):
    # What a mixed-precision second derivative replays: each cell's products rounded as rnnc's
    # interpreter rounds them (fp16 the weights, bf16 both operands), against the interpreter
    # running the layer with those weights (seed 4841: all agree to 1e-6, against 2e-5 to 7e-3
    # for the torch form without rounding). bf16 rounds the states too, where a value summed
    # in another order can tip by 2^-8: a bound of 1e-3, with nearly every element to 1e-4.
    cells = random_cells(4841, 30, tmp_path)
    checked = 0
    for (index, source), dtype in itertools.product(enumerate(cells), ["bf16", "fp16"]):
        sizes = {name: 4 for name in re.search(r"cell fuzz\(([^)]*)\)", source)[1].split(", ")}
        sizes.update(input_size=5, hidden_size=6)
        declared = dict(re.findall(r"(\w+)\[([^\]]+)\]", re.search(r"input (.*)", source)[1]))
        torch.manual_seed(index)
        layer = rnnc.nn.Recurrent(source, jit=False, weights_dtype=dtype, **sizes).eval()
        x, lengths = torch.randn(4, 3, 5), [4, 1, 3]
        sides = {name: torch.randn(4, 3, eval(declared[name], {}, dict(sizes)))
                 for name in layer.side_input_names}
        with torch.no_grad():
            try:
                want_y, _ = layer(x, lengths=torch.tensor(lengths), **sides)
            except ValueError as error:  # a cell with no product of parameter weights
                assert "would change nothing" in str(error)
                continue
            forward = ir_recurrence(source, sizes, layer._input_size, 1, False, False, lengths)
            y, _ = forward(x, [None] * len(layer.state_sizes), list(sides.values()),
                           list(layer.parameters()), products=dtype)
        what = f"cell {index} of fuzz_cells --seed 4841, {dtype}"
        scale = float(want_y.abs().max()) + 1e-6
        close = ((y - want_y).abs() <= 1e-4 * scale).float().mean()
        if dtype == "fp16":
            assert relative(y, want_y) <= 1e-4, what
        else:
            assert relative(y, want_y) <= 1e-3 and close >= 0.98, f"{what}: {close:.3f} close"
        checked += 1
    assert checked >= 20  # most random cells have a product of parameter weights


def test_random_cells_with_dropout_in_training_replay_the_masks_rnnc_drew(tmp_path):
    # In training, a cell's dropouts (of rows, and of weights) draw masks from the call's seed:
    # the torch form applies the same ones (_dropout_masks.py), or a second derivative through
    # them would differentiate another forward; with dropout between layers where it stacks.
    cells = [cell for cell in random_cells(4852, 40, tmp_path) if "dropout(" in cell]
    assert len(cells) >= 10
    for index, source in enumerate(cells):
        agrees_with_rnnc(source, index, f"cell {index} with dropout of fuzz_cells --seed 4852",
                         seed=1000 + index)


class SidesAsArguments(torch.nn.Module):
    """A layer whose side inputs come as arguments after x, so that torch.jit.trace sees them."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x, *sides):
        return self.layer(x, side_inputs=dict(zip(self.layer.side_input_names, sides)))[0]


def test_random_cells_traced_run_and_differentiate_twice_as_the_eager_layer(tmp_path):
    # A traced model runs rnnc::forward from a spec (the cell's source, sizes, the input's size
    # name): whatever the spec leaves out shows here, as a traced cell whose input is x[2*half]
    # did (its recorded backward bound a size the cell lacks). The forward and a second
    # derivative by x against the eager layer's, for random cells (x reaching the output).
    cells = random_cells(4855, 24, tmp_path)
    checked = 0
    for index, source in enumerate(cells):
        sizes = {name: 4 for name in re.search(r"cell fuzz\(([^)]*)\)", source)[1].split(", ")}
        sizes.update(input_size=5, hidden_size=6)
        declared = dict(re.findall(r"(\w+)\[([^\]]+)\]", re.search(r"input (.*)", source)[1]))
        torch.manual_seed(index)
        model = SidesAsArguments(rnnc.nn.Recurrent(source, jit=False, **sizes).eval())
        sides = [torch.randn(4, 3, eval(declared[name], {}, dict(sizes)))
                 for name in model.layer.side_input_names]
        x = torch.randn(4, 3, 5)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(model, (x, *sides))
        second = []
        for run in (model, traced):
            xs = x.clone().requires_grad_(True)
            y = run(xs, *sides)
            grad_x, = torch.autograd.grad(y.pow(2).sum(), xs, create_graph=True, allow_unused=True)
            if grad_x is None:  # x reaches no output of this cell
                break
            second.append((y.detach(), torch.autograd.grad(grad_x.pow(2).sum(), xs)[0]))
        if len(second) < 2:
            continue
        what = f"cell {index} of fuzz_cells --seed 4855, traced"
        assert relative(second[1][0], second[0][0]) <= 1e-5, f"{what}: output"
        assert relative(second[1][1], second[0][1]) <= 1e-4, f"{what}: a second derivative"
        checked += 1
    assert checked >= 20
