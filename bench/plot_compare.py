#!/usr/bin/env python3
"""bench/plot_compare.py RESULTS.json OUT.png|OUT.svg: bench/compare's results as a chart.

One panel per thread count; per config, a bar per engine with its GFLOP/s (the figure on the
bar is its median ms), and the FMA peak measured in the same run as a dashed line: what the
hardware allows, next to what each engine reached. bench/compare --plot FILE calls it (with
Debian's /usr/bin/python3 and python3-matplotlib).
"""
import json
import sys


def main():
    if len(sys.argv) != 3:
        print(__doc__.split("\n")[0], file=sys.stderr)
        return 2
    source, target = sys.argv[1], sys.argv[2]
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only, no display
        import matplotlib.pyplot as plt
    except ImportError as e:
        print(f"plot_compare.py: cannot import matplotlib ({e}); Debian: python3-matplotlib",
              file=sys.stderr)
        return 3
    with open(source) as f:
        record = json.load(f)
    results = [r for r in record["results"]]
    peaks = {int(n): p.get("gflops") for n, p in record.get("peak", {}).items()}
    threads = sorted({r["threads"] for r in results})
    configs = list(dict.fromkeys(r["config"] for r in results))
    engines = list(dict.fromkeys(r["engine"] for r in results))
    titles = {"rnnc": "rnnc", "onednn": "oneDNN", "pytorch": "PyTorch"}

    figure, axes = plt.subplots(1, len(threads), figsize=(max(6, 2.2 * len(configs)) *
                                                          len(threads), 4.5), squeeze=False)
    width = 0.8 / max(1, len(engines))
    for panel, n in zip(axes[0], threads):
        for k, engine in enumerate(engines):
            xs, heights, labels = [], [], []
            for i, config in enumerate(configs):
                row = next((r for r in results if r["threads"] == n and r["config"] == config
                            and r["engine"] == engine), None)
                if row and row.get("gflops"):
                    xs.append(i + (k - (len(engines) - 1) / 2) * width)
                    heights.append(row["gflops"])
                    labels.append(f"{row['median_ms']:.3g} ms")
            bars = panel.bar(xs, heights, width, label=titles.get(engine, engine))
            for bar, label in zip(bars, labels):
                panel.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                               ha="center", va="bottom", fontsize=7, rotation=90)
        if peaks.get(n):
            panel.axhline(peaks[n], linestyle="--", color="black", linewidth=1,
                          label=f"FMA peak {peaks[n]:.0f} GFLOP/s")
        panel.set_xticks(range(len(configs)))
        panel.set_xticklabels(configs, rotation=30, ha="right")
        panel.set_ylabel("GFLOP/s (matrix products)")
        panel.set_title(f"{n} thread{'s' if n > 1 else ''}")
        panel.legend(fontsize=8)
    cpu = record.get("machine", {}).get("cpu", "")
    figure.suptitle(f"bench/compare on {cpu}" if cpu else "bench/compare")
    figure.tight_layout()
    figure.savefig(target)
    print(f"plot_compare.py: wrote {target}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
