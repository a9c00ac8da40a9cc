#!/usr/bin/env python3
"""Judges and plots the power traces of scripts/device/homeo.sh (issue #28).

Each NAME.csv is an `octoflow serve --sensor-log` trace; load.log holds serve_load.py's JSON line
per run after a "== NAME" line (its wall-clock window). For each run, over the load window less
the first --settle seconds: mean power, and the deviation of the one-second power readings from
the target (mean and 95th percentile of |P - target| / target). Prints a Markdown table and
writes the plot.

  python3 scripts/bench/power_trace.py DIR... --plot docs/img/power-pacing.png
"""

import argparse
import csv
import json
import os
import sys


def runs(dirs):
    """(name, load JSON, trace rows) for every run found in the directories' load.log files."""
    out = []
    for d in dirs:
        name = None
        with open(os.path.join(d, "load.log")) as f:
            for line in f:
                if line.startswith("== "):
                    name = line[3:].strip()
                elif line.startswith("{") and name:
                    load = json.loads(line)
                    with open(os.path.join(d, name + ".csv")) as t:
                        rows = [r for r in csv.DictReader(t) if r["power_w"]]
                    out.append((name, load, rows))
                    name = None
    return out


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main(a):
    found = runs(a.dirs)
    if not found:
        sys.exit("no runs found")
    print("| run | tok/s | mean power W | J/token | tokens/J | target held: mean / p95 deviation |")
    print("|---|---|---|---|---|---|")
    plots = []
    for name, load, rows in found:
        t0, t1 = load["unix_start"], load["unix_end"]
        window = [r for r in rows if t0 + a.settle <= float(r["unix_s"]) <= t1]
        power = [float(r["power_w"]) for r in window]
        target = float(name[:-1]) if name.endswith("w") else None
        held = "—"
        if target:
            dev = [abs(p - target) / target for p in power]
            held = f"{100 * sum(dev) / len(dev):.1f}% / {100 * percentile(dev, 0.95):.1f}%"
        print(f"| {name} | {load['tok_per_s']:,.0f} | {sum(power) / len(power):.1f} | "
              f"{load['j_per_token']:.4f} | {load['tokens_per_j']:.2f} | {held} |")
        plots.append((name, target, [(float(r["unix_s"]) - t0, float(r["power_w"])) for r in rows
                                     if t0 - 5 <= float(r["unix_s"]) <= t1 + 5]))
    if a.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(9, 4.5))
        for (name, target, pts), color in zip(plots, ["tab:red", "tab:blue", "tab:green", "tab:purple"]):
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, lw=0.8,
                    label=name if name != "unpaced" else "unpaced")
            if target:
                ax.axhline(target, color=color, ls="--", lw=0.8)
        ax.set_xlabel("seconds since the load started")
        ax.set_ylabel("board power, W (NVML, 1-s average, 10 Hz)")
        ax.set_title(a.title)
        ax.set_ylim(bottom=0)
        ax.legend(loc="upper right")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(a.plot, dpi=110)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dirs", nargs="+")
    p.add_argument("--settle", type=float, default=20.0)
    p.add_argument("--plot")
    p.add_argument("--title", default="octoflow serve, 128 streams: power unpaced and paced")
    main(p.parse_args())
