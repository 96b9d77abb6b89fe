#!/usr/bin/env python3
"""Times torch.nn.LSTM / torch.nn.GRU / torch.nn.RNN (tanh) forward inference (or, with --backward, forward + autograd backward) on one shape; prints one line of JSON.

    /usr/bin/python3 bench/pytorch_rnn.py --cell lstm --seq 100 --batch 64 --input 512 \
        --hidden 512 --threads 2 --repeat 5 --warmup 1

One layer, one direction, fp32, eval mode under torch.no_grad(), random input and initial
states; the median, min and max of --repeat timed calls (after --warmup untimed ones) are
reported in milliseconds. --dtype int8 times PyTorch's dynamic quantization instead
(torch.ao.quantization.quantize_dynamic with qint8 weights: LSTM and GRU; torch has no
quantized nn.RNN). Used by bench/compare; exits with status 3 when torch is missing.
"""
import argparse
import json
import os
import statistics
import sys
import time


def positive(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def loaded_blas():
    """The BLAS libraries mapped into this process (PyTorch's fp32 GEMM runs on one of them)."""
    names = set()
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                base = path.rsplit("/", 1)[-1]
                if path.startswith("/") and any(k in base for k in ("blas", "blis", "mkl_")):
                    names.add(path)
    except OSError:
        pass
    return sorted(names)


def cpu_capability(torch):
    """The vector ISA of ATen's own kernels ("CPU capability usage" in torch.__config__), and the
    kernel set OpenBLAS picked for this CPU, when OpenBLAS is loaded."""
    isa = "?"
    for line in torch.__config__.show().splitlines():
        if "CPU capability usage:" in line:
            isa = line.split(":", 1)[1].strip()
    import ctypes
    for path in loaded_blas():
        try:
            core = ctypes.CDLL(path).openblas_get_corename  # already loaded: no second copy
            core.restype = ctypes.c_char_p
            return f"{isa}, OpenBLAS {core().decode()}"
        except (AttributeError, OSError):
            continue
    return isa


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", choices=["lstm", "gru", "rnn_tanh"], default="lstm")
    parser.add_argument("--seq", type=positive, default=100, help="sequence length T")
    parser.add_argument("--batch", type=positive, default=64, help="batch size B")
    parser.add_argument("--input", type=positive, default=512, help="input_size I")
    parser.add_argument("--hidden", type=positive, default=512, help="hidden_size H")
    parser.add_argument("--threads", type=positive, default=1, help="torch.set_num_threads")
    parser.add_argument("--repeat", type=positive, default=5, help="timed runs")
    parser.add_argument("--warmup", type=non_negative, default=1, help="untimed runs first")
    parser.add_argument("--dtype", choices=["fp32", "int8"], default="fp32",
                        help="int8: the module through quantize_dynamic (qint8 weights)")
    parser.add_argument("--backward", action="store_true",
                        help="train mode: forward, then y.sum().backward() (input grads too)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: the module and data on the GPU (cuDNN), synchronised around "
                             "each timed run")
    parser.add_argument("--no-tf32", action="store_true",
                        help="with --device cuda: strict fp32 in cuDNN (torch.backends.cudnn."
                             "allow_tf32 = False; PyTorch's default allows TF32 tensor cores)")
    args = parser.parse_args()
    # torch.set_num_threads does not reach the BLAS library torch loads (Debian's torch uses
    # the system libblas.so.3, OpenBLAS when installed, which starts one thread per core):
    # limit it before torch loads it.
    for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[variable] = str(args.threads)

    try:
        import torch
    except ImportError as e:
        print(f"pytorch_rnn.py: cannot import torch ({e}); Debian: python3-torch", file=sys.stderr)
        return 3

    torch.set_num_threads(args.threads)
    torch.manual_seed(12345)
    if args.cell == "rnn_tanh":
        rnn = torch.nn.RNN(args.input, args.hidden, nonlinearity="tanh").eval()
    else:
        module_type = torch.nn.LSTM if args.cell == "lstm" else torch.nn.GRU
        rnn = module_type(args.input, args.hidden).eval()
    if args.dtype == "int8":
        if args.cell == "rnn_tanh" or args.backward:
            print("pytorch_rnn.py: torch has no dynamically quantized nn.RNN, and quantized "
                  "modules do not train", file=sys.stderr)
            return 2
        # quantize_dynamic swaps submodules, not the module it is given.
        rnn = torch.ao.quantization.quantize_dynamic(
            torch.nn.Sequential(rnn), {torch.nn.LSTM, torch.nn.GRU}, dtype=torch.qint8)[0]
    x = torch.rand(args.seq, args.batch, args.input) * 2 - 1
    h0 = torch.rand(1, args.batch, args.hidden) * 2 - 1
    state = (h0, torch.rand(1, args.batch, args.hidden) * 2 - 1) if args.cell == "lstm" else h0
    cuda = args.device == "cuda"
    if cuda:
        if not torch.cuda.is_available():
            print("pytorch_rnn.py: torch sees no CUDA GPU", file=sys.stderr)
            return 2
        if args.dtype != "fp32":
            print("pytorch_rnn.py: --dtype int8 is CPU-only", file=sys.stderr)
            return 2
        torch.backends.cudnn.allow_tf32 = not args.no_tf32
        rnn = rnn.cuda()
        x = x.cuda()
        state = tuple(s.cuda() for s in state) if isinstance(state, tuple) else state.cuda()

    def synchronise():
        if cuda:
            torch.cuda.synchronize()

    times = []
    if args.backward:
        rnn.train()
        x.requires_grad_(True)

        def step():
            rnn.zero_grad(set_to_none=True)
            x.grad = None
            out, _ = rnn(x, state)
            out.sum().backward()
            return out.detach()

        for _ in range(args.warmup):
            step()
        for _ in range(args.repeat):
            synchronise()
            start = time.perf_counter()
            y = step()
            synchronise()
            times.append((time.perf_counter() - start) * 1e3)
    else:
        with torch.no_grad():
            for _ in range(args.warmup):
                rnn(x, state)
            for _ in range(args.repeat):
                synchronise()
                start = time.perf_counter()
                y, _ = rnn(x, state)
                synchronise()
                times.append((time.perf_counter() - start) * 1e3)
    checksum = float(y.sum())
    if checksum != checksum:  # NaN
        print("pytorch_rnn.py: the output is not finite", file=sys.stderr)
        return 1

    print(json.dumps({
        "engine": "pytorch",
        "cell": args.cell,
        "T": args.seq,
        "B": args.batch,
        "I": args.input,
        "H": args.hidden,
        "threads": torch.get_num_threads(),
        "median_ms": statistics.median(times),
        "min_ms": min(times),
        "max_ms": max(times),
        "repeat": args.repeat,
        "warmup": args.warmup,
        "backward": args.backward,
        "dtype": args.dtype,
        "quantized_engine": torch.backends.quantized.engine,
        "version": torch.__version__,
        "mkldnn_enabled": bool(torch.backends.mkldnn.is_available()),
        "blas": loaded_blas(),
        "isa": cpu_capability(torch),
        "checksum": checksum,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "tf32": bool(cuda and torch.backends.cudnn.allow_tf32),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
