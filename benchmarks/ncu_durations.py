"""The kernels of an ``ncu --metrics gpu__time_duration.sum --csv`` run, one line: the last N
launches as ``name=duration`` (ns), e.g. one request's planner and attention kernels after
warm-ups (``benchmarks/request_kernels.py``).

    python3 benchmarks/ncu_durations.py RUN.csv [--last 4] [--label TEXT]
"""

import argparse
import csv


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--last", type=int, default=4)
    ap.add_argument("--label", default="")
    args = ap.parse_args(argv)
    with open(args.csv) as f:
        rows = [r for r in csv.reader(f) if len(r) > 10]  # ncu's table, not its log lines
    if not rows:
        print(args.label, "no kernels recorded")
        return 1
    head, rows = rows[0], rows[1:]
    name, value = head.index("Kernel Name"), head.index("Metric Value")
    print(args.label, " ".join(f"{r[name][:16]}={r[value]}" for r in rows[-args.last:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
