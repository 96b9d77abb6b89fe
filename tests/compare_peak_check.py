#!/usr/bin/env python3
"""bench/compare's check of its FMA peak meter, with a meter that reads what the test says.

compare refuses a table in which an engine runs above 100% of the peak it measured (the meter
is then wrong), but a VM neighbour can lower the one reading taken before the runs. So an engine
above the first reading has the peak measured again, and only one above both readings is
refused. This runs compare on a build directory of the real rnnc and a stand-in fma_peak that
reads a given sequence of peaks (GFLOP/s, one per call):

    compare_peak_check.py BUILD_DIR

Case 1: 1e-6 GFLOP/s then 1e6: the table is printed and a note says the peak was measured again.
Case 2: 1e-6 GFLOP/s every time: compare exits 2 saying the meter reads low, no table.
The low reading is far below any run's rate: the tiny shape's rnnc reads a few GFLOP/s on an
idle machine, under 1 while the other tests load it.
"""

import json
import os
import pathlib
import subprocess
import sys
import tempfile

COMPARE = pathlib.Path(__file__).resolve().parent.parent / "bench" / "compare"

FAKE_PEAK = """#!/bin/sh
# Prints the next reading of READINGS (the last one again once they run out).
dir=$(dirname "$0")
calls=$(cat "$dir/calls" 2>/dev/null || echo 0)
echo $((calls + 1)) > "$dir/calls"
gflops=$(sed -n "$((calls + 1))p" "$dir/readings")
[ -n "$gflops" ] || gflops=$(tail -n 1 "$dir/readings")
printf '{"engine":"fma_peak","threads":1,"gflops":%s,"max_gflops":%s,"per_thread_gflops":%s,\
"isa":"avx512f","ghz":1.0,"flop_per_cycle":%s,"widths":[{"isa":"avx512f","gflops":%s,\
"max_gflops":%s,"flop_per_cycle":%s,"ghz":1.0},{"isa":"avx2+fma","gflops":%s,"max_gflops":%s,\
"flop_per_cycle":%s,"ghz":1.0}],"ms":1,"runs":1,"hardware_threads":1}\\n' \
  $gflops $gflops $gflops $gflops $gflops $gflops $gflops $gflops $gflops $gflops
"""


def run_compare(build, readings, workdir):
    fake = pathlib.Path(workdir) / "build"
    (fake / "tools").mkdir(parents=True)
    (fake / "bench").mkdir()
    (fake / "tools" / "rnnc").symlink_to(pathlib.Path(build).resolve() / "tools" / "rnnc")
    peak = fake / "bench" / "fma_peak"
    peak.write_text(FAKE_PEAK)
    peak.chmod(0o755)
    (fake / "bench" / "readings").write_text("".join(f"{r}\n" for r in readings))
    out = pathlib.Path(workdir) / "out.json"
    done = subprocess.run(
        [sys.executable, str(COMPARE), "--build", str(fake), "--quick", "--threads", "1",
         "--configs", "rnn-batch1", "--skip-onednn", "--skip-pytorch", "--json", str(out)],
        capture_output=True, text=True, timeout=600, env=dict(os.environ))
    calls = int((fake / "bench" / "calls").read_text())
    return done, calls, out


def main():
    build = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as workdir:
        done, calls, out = run_compare(build, [1e-6, 1e6], workdir)
        text = done.stdout + done.stderr
        if done.returncode != 0 or calls != 2 or "measured again after the runs" not in text:
            failures.append(f"a low first reading then a good one: exit {done.returncode}, "
                            f"{calls} meter calls (want 0 and 2), output:\n{text}")
        elif json.loads(out.read_text())["peak"]["1"]["gflops"] != 1e6:
            failures.append("the JSON keeps the first reading of the peak, not the better one")
    with tempfile.TemporaryDirectory() as workdir:
        done, calls, _ = run_compare(build, [1e-6], workdir)
        text = done.stdout + done.stderr
        if done.returncode != 2 or calls != 2 or "reads low; no table printed" not in text:
            failures.append(f"a meter low twice: exit {done.returncode}, {calls} meter calls "
                            f"(want 2 and 2), output:\n{text}")
    for failure in failures:
        print("FAILED:", failure)
    if failures:
        return 1
    print("compare_peak_check: both cases as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
