"""rnnc from Python in one page: swap torch.nn.LSTM for rnnc's, run a custom cell, read its IR.

Run from the repository after building: PYTHONPATH=build/python /usr/bin/python3
examples/python_quickstart.py (or with nothing set after `cmake --install build`)."""

import os
import time

import numpy as np
import torch

import rnnc

# 1. A torch.nn.LSTM's twin: same weights, same call, same results.
torch.manual_seed(0)
reference = torch.nn.LSTM(256, 256, num_layers=2).eval()
lstm = rnnc.from_torch(reference)
x = torch.randn(50, 16, 256)
with torch.no_grad():
    start = time.perf_counter()
    want, _ = reference(x)
    torch_ms = (time.perf_counter() - start) * 1e3
lstm(x)  # the first call compiles (or loads from rnnc's disk cache)
start = time.perf_counter()
y, (h_n, c_n) = lstm(x)
rnnc_ms = (time.perf_counter() - start) * 1e3
print(f"LSTM 2x256, T=50 B=16: max difference from torch {float((y - want).abs().max()):.2e}; "
      f"torch {torch_ms:.1f} ms, rnnc {rnnc_ms:.1f} ms")

# 2. Your own cell, from its source (a .cell path works too), with numpy arrays.
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "mgu.cell")) as f:
    mgu = f.read()
layer = rnnc.Layer(mgu, input_size=8, hidden_size=32)
rng = np.random.default_rng(0)
layer.load_state_dict({
    name: rng.uniform(-0.2, 0.2, shape).astype(np.float32)
    for name, shape in [("weight_f", (32, 8)), ("weight_uf", (32, 32)), ("bias_f", (32,)),
                        ("weight_h", (32, 8)), ("weight_uh", (32, 32)), ("bias_h", (32,))]})
out, final = layer(rng.standard_normal((20, 4, 8)).astype(np.float32))
print(f"custom cell: output {out.shape}, final states {list(final)}")

# 3. What rnnc made of it: the IR after every pass.
print(layer.ir(after="all").splitlines()[0])
print(layer.ir())

# 4. Inside a torch model: rnnc.nn's layers are torch.nn's (parameters, state_dict, optimisers)
#    with rnnc's forward and backward. Train in mixed precision (bf16 products, fp32
#    parameters: the module's weights_dtype, or torch.autocast("cpu", torch.bfloat16)), evaluate
#    with int8 weights, and deploy through TorchScript, which records rnnc's operator
#    (torch.jit.load needs `import rnnc.nn`).
import rnnc.nn  # noqa: E402


class Classifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = rnnc.nn.GRU(8, 32, batch_first=True)
        self.head = torch.nn.Linear(32, 3)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.head(y[:, -1])


model = Classifier()
optimiser = torch.optim.Adam(model.parameters(), lr=1e-2)
inputs, labels = torch.randn(64, 12, 8), torch.randint(0, 3, (64,))
for step in range(20):
    optimiser.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(inputs), labels)
    loss.backward()
    optimiser.step()
model.eval()
model.rnn.weights_dtype = "int8"
with torch.inference_mode():
    agreement = (model(inputs).argmax(1) == labels).float().mean()
scripted = torch.jit.script(model)
with torch.inference_mode():
    same = torch.equal(scripted(inputs), model(inputs))
print(f"trained: loss {float(loss):.3f}; with int8 weights {float(agreement):.0%} of the labels "
      f"right; the scripted model gives the same: {same}")
