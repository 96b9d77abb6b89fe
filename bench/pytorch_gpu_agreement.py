#!/usr/bin/env python3
"""rnnc on the GPU against PyTorch on the same GPU: the same layer, weights and inputs.

    python3 bench/pytorch_gpu_agreement.py --rnnc build/tools/rnnc [--json]

For each case (LSTM, GRU and tanh RNN of one layer; a stacked bidirectional LSTM; a GRU with
sequence lengths) PyTorch builds the module on the GPU in strict fp32 (TF32 off in cuDNN and
cuBLAS, so that the reference is fp32 arithmetic), draws uniform weights, inputs and initial
states from a fixed seed, and runs it; the weights (safetensors, state_dict names), inputs and
states are written to a temporary folder and `rnnc run --device cuda` runs the layer from them.
Prints a table of the largest absolute differences of the outputs and final states, and exits 1
when one is over --tolerance (1e-4, issue 15's target), 2 without a GPU. Needs torch and numpy
(the GPU machine's Python); the safetensors file is written here, without that package.
"""
import argparse
import json
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

# name: (module, cell, T, B, I, H, layers, bidirectional, with lengths)
CASES = {
    "lstm": ("LSTM", "lstm", 50, 16, 96, 128, 1, False, False),
    "gru": ("GRU", "gru", 50, 16, 96, 128, 1, False, False),
    "rnn_tanh": ("RNN", "rnn_tanh", 50, 16, 96, 128, 1, False, False),
    "lstm-l2-bi": ("LSTM", "lstm", 30, 8, 64, 96, 2, True, False),
    "gru-lengths": ("GRU", "gru", 30, 8, 64, 96, 1, False, True),
    "lstm-default": ("LSTM", "lstm", 100, 64, 512, 512, 1, False, False),
    "lstm-batch1": ("LSTM", "lstm", 100, 1, 256, 256, 1, False, False),
}


def write_safetensors(path, tensors):
    """tensors: name -> contiguous float32 numpy array."""
    header, offset, blobs = {}, 0, []
    for name, array in tensors.items():
        data = array.astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for blob in blobs:
            f.write(blob)


def run_case(torch, np, rnnc, name, folder, dev, rnnc_device):
    module_name, cell, T, B, I, H, layers, bidirectional, lengths = CASES[name]
    torch.manual_seed(list(CASES).index(name))  # hash(str) differs between processes
    kwargs = {"num_layers": layers, "bidirectional": bidirectional}
    if module_name == "RNN":
        kwargs["nonlinearity"] = "tanh"
    module = getattr(torch.nn, module_name)(I, H, **kwargs).to(dev).eval()
    directions = 2 if bidirectional else 1
    x = torch.rand(T, B, I, device=dev) * 2 - 1
    h0 = torch.rand(layers * directions, B, H, device=dev) * 2 - 1
    c0 = torch.rand(layers * directions, B, H, device=dev) * 2 - 1
    state = (h0, c0) if module_name == "LSTM" else h0
    seq_lengths = None
    with torch.no_grad():
        if lengths:
            seq_lengths = torch.randint(1, T + 1, (B,))
            seq_lengths[0] = T
            packed = torch.nn.utils.rnn.pack_padded_sequence(x, seq_lengths, enforce_sorted=False)
            out, final = module(packed, state)
            y, _ = torch.nn.utils.rnn.pad_packed_sequence(out, total_length=T)
        else:
            y, final = module(x, state)
    hn, cn = final if module_name == "LSTM" else (final, None)

    folder.mkdir(parents=True, exist_ok=True)
    write_safetensors(folder / "weights.safetensors",
                      {k: v.detach().cpu().numpy() for k, v in module.state_dict().items()})
    np.save(folder / "x.npy", x.cpu().numpy())
    np.save(folder / "h0.npy", h0.cpu().numpy())
    command = [str(rnnc), "run", "--device", rnnc_device, "--cell", cell, "--weights",
               str(folder / "weights.safetensors"), "--input", str(folder / "x.npy"),
               "--h0", str(folder / "h0.npy"), "--output", str(folder / "y.npy"),
               "--hn", str(folder / "hn.npy"), "--num-layers", str(layers)]
    if bidirectional:
        command.append("--bidirectional")
    if module_name == "LSTM":
        np.save(folder / "c0.npy", c0.cpu().numpy())
        command += ["--c0", str(folder / "c0.npy"), "--cn", str(folder / "cn.npy")]
    if seq_lengths is not None:
        np.save(folder / "lengths.npy", seq_lengths.numpy().astype(np.int64))
        command += ["--lengths", str(folder / "lengths.npy")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        return {"case": name, "error": (done.stderr or done.stdout).strip()[-500:]}
    errors = {"output": float(np.abs(np.load(folder / "y.npy") - y.cpu().numpy()).max()),
              "hn": float(np.abs(np.load(folder / "hn.npy") - hn.cpu().numpy()).max())}
    if cn is not None:
        errors["cn"] = float(np.abs(np.load(folder / "cn.npy") - cn.cpu().numpy()).max())
    return {"case": name, "shape": f"{T}x{B}x{I}x{H} L{layers}{' bi' if bidirectional else ''}"
            f"{' lengths' if lengths else ''}", "max_abs_error": errors}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rnnc", required=True, help="the rnnc program")
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated names")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--json", action="store_true", help="also print the results as JSON")
    parser.add_argument("--emulated", action="store_true",
                        help="check this script without a GPU: PyTorch on the CPU, rnnc's kernels "
                             "emulated (--device cuda-emulated; slow: use small cases)")
    args = parser.parse_args()
    import numpy as np
    import torch
    dev, rnnc_device = ("cpu", "cuda-emulated") if args.emulated else ("cuda", "cuda")
    if not args.emulated and not torch.cuda.is_available():
        print("pytorch_gpu_agreement.py: torch sees no CUDA GPU", file=sys.stderr)
        return 2
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    results = []
    with tempfile.TemporaryDirectory() as temporary:
        for name in [n for n in args.cases.split(",") if n]:
            if name not in CASES:
                parser.error(f"unknown case {name}")
            results.append(run_case(torch, np, Path(args.rnnc), name, Path(temporary) / name,
                                    dev, rnnc_device))
    failed = False
    print(f"{'case':<14}{'shape':<26}{'max |rnnc cuda - PyTorch cuda|':>34}")
    for r in results:
        if "error" in r:
            failed = True
            print(f"{r['case']:<14}{'':<26}{'rnnc failed: ' + r['error'].splitlines()[-1]:>34}")
            continue
        worst = max(r["max_abs_error"].values())
        failed |= not worst <= args.tolerance
        detail = ", ".join(f"{k} {v:.2e}" for k, v in r["max_abs_error"].items())
        print(f"{r['case']:<14}{r['shape']:<26}{detail:>34}")
    print(f"PyTorch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"{torch.cuda.get_device_name() if dev == 'cuda' else 'CPU, rnnc emulated'}, TF32 off; tolerance {args.tolerance:g}: "
          + ("FAILED" if failed else "all within"))
    if args.json:
        print(json.dumps({"results": results, "tolerance": args.tolerance}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
