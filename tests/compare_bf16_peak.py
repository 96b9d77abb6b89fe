#!/usr/bin/env python3
"""bench/compare --dtype bf16 meters rnnc's bf16 products against vdpbf16ps's own peak.

On AMD's AVX512_BF16 rnnc multiplies bf16 pairs by vdpbf16ps, twice an FMA's products: against
the FMA peak its rows would read up to 200%, so compare measured no % of peak for them. It now
measures vdpbf16ps's peak too (fma_peak --bf16) and gives rnnc bf16's % of it, at most 100%
(above it the table is refused, as for any engine above its meter). This runs compare on tiny
shapes and reads its JSON record:

    compare_bf16_peak.py BUILD_DIR

Exits 0 when the record has the bf16 peak, at 32-147 FLOP per cycle (half of Zen 4's 64 to 115%
of Zen 5's 128), and rnnc bf16's rows a % of it; 77 (skipped) on a CPU whose bf16 products do
not run on vdpbf16ps (no AVX512_BF16, or AMX tiles, or Intel's, widened onto the FMAs).
"""

import json
import pathlib
import subprocess
import sys
import tempfile

COMPARE = pathlib.Path(__file__).resolve().parent.parent / "bench" / "compare"
SKIPPED = 77


def main():
    build = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        record_path = pathlib.Path(tmp) / "compare.json"
        proc = subprocess.run(
            [sys.executable, str(COMPARE), "--build", build, "--quick", "--threads", "1",
             "--configs", "lstm-default", "--dtype", "bf16", "--skip-onednn", "--skip-pytorch",
             "--peak-ms", "20", "--json", str(record_path)], capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stdout + proc.stderr)
            print(f"compare_bf16_peak: compare exited {proc.returncode}")
            return 1
        record = json.loads(record_path.read_text())
    peaks = record.get("bf16_peak", {})
    if not peaks:
        print("compare_bf16_peak: no vdpbf16ps products on this CPU (no bf16 peak measured): "
              "skipped")
        return SKIPPED
    per_cycle = peaks["1"]["flop_per_cycle"]
    rows = [r for r in record["results"] if r["engine"] == "rnnc_reduced"]
    pct = [r["pct_peak"] for r in rows]
    print(f"compare_bf16_peak: bf16 peak {peaks['1']['gflops']:.1f} GFLOP/s, "
          f"{per_cycle:.1f} FLOP/cycle; rnnc bf16 at {pct} % of it")
    if not 32 <= per_cycle <= 147:
        print("compare_bf16_peak: the bf16 peak's FLOP per cycle is not a vdpbf16ps core's")
        return 1
    if not rows or any(p is None or not 0 < p <= 100 for p in pct):
        print("compare_bf16_peak: rnnc bf16's rows have no % of the bf16 peak in (0, 100]")
        return 1
    print("compare_bf16_peak: rnnc bf16 read against the vdpbf16ps peak")
    return 0


if __name__ == "__main__":
    sys.exit(main())
