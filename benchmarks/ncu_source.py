"""Summarize ncu's per-instruction source page (``ncu -i REPORT --page source --csv
--print-source sass > X.csv``, of a report taken with ``--section SourceCounters --section
WarpStateStats``): where a kernel's warps wait, instruction by instruction.

    python3 benchmarks/ncu_source.py X.csv[.gz] [--top 25] [--compare Y.csv[.gz]]

Prints the warp-state samples by stall reason, the instruction mix (warp-level instructions
executed), the samples split by how often an instruction ran (the main loop's body, spin waits,
and rows run less often: per task, per CTA, or a producer's loop), and the instructions with the
most samples with their main reasons. Samples are taken at a fixed interval per SM
sub-partition, so a row's share of the samples is its share of the warps' time -- not of the
kernel's critical path: a stall other warps hide costs nothing (see RESULTS, fourteenth session).
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import io
from dataclasses import dataclass


@dataclass
class SourcePage:
    """One kernel's rows of the source page: SASS text, executions, samples by reason."""

    sass: list[str]
    executed: list[int]
    samples: list[float]
    reasons: dict[str, list[float]]  # reason -> per-row samples

    @property
    def total(self) -> float:
        return sum(self.samples) or 1.0


def read_page(path: str) -> SourcePage:
    """The first kernel's table of an ncu source-page CSV (plain or gzipped)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = list(csv.reader(io.StringIO(f.read())))
    # Row 0 names the kernel; row 1 is the header.
    hdr, data = rows[1], [r for r in rows[2:] if len(r) == len(rows[1])]
    col = hdr.index

    def num(r: list[str], i: int) -> float:
        return float(r[i] or 0)

    reasons = {h[len("stall_"):]: [num(r, i) for r in data] for i, h in enumerate(hdr)
               if h.startswith("stall_") and "Not Issued" not in h}
    return SourcePage(sass=[r[col("Source")] for r in data],
                      executed=[int(num(r, col("Instructions Executed"))) for r in data],
                      samples=[num(r, col("Warp Stall Sampling (All Samples)")) for r in data],
                      reasons=reasons)


def opcode(sass: str) -> str:
    words = [w for w in sass.split() if not w.startswith("@")]
    return words[0].split(".")[0] if words else "?"


def summary(p: SourcePage, top: int) -> str:
    out = []
    by_reason = {k: sum(v) / p.total * 100 for k, v in p.reasons.items()}
    out.append(f"samples {p.total:.0f}, warp instructions executed {sum(p.executed) / 1e6:.1f} M")
    out.append("stall reasons (% of samples): " + ", ".join(
        f"{k} {v:.1f}" for k, v in sorted(by_reason.items(), key=lambda x: -x[1]) if v >= 0.5))
    mix = collections.Counter()
    for s, e in zip(p.sass, p.executed):
        mix[opcode(s)] += e
    out.append("instruction mix (M warp instructions): " + ", ".join(
        f"{k} {v / 1e6:.1f}" for k, v in mix.most_common(16)))
    # The main loop's body: the execution count (to 1%) under which the most instructions ran;
    # rows run more often are spin waits (barrier polls); rows run less often are per task or
    # per CTA, or the loop of a role with fewer warps (a producer warpgroup).
    weight = collections.Counter()
    for e in p.executed:
        if e:
            weight[round(e, -max(len(str(e)) - 2, 0))] += e
    body = weight.most_common(1)[0][0]
    groups = collections.Counter()
    for s, e in zip(p.samples, p.executed):
        groups["never run" if not e else "loop body" if abs(e - body) <= 0.05 * body
               else "run more often (spin waits)" if e > body else "run less often"] += s
    out.append(f"samples by how often a row ran (the loop body's rows {body} times): " +
               ", ".join(f"{k} {v / p.total * 100:.1f}%" for k, v in groups.items()))
    out.append(f"top {top} rows by samples (row, share, executions, SASS, main reasons):")
    for j in sorted(sorted(range(len(p.sass)), key=lambda j: -p.samples[j])[:top]):
        why = sorted(((v[j], k) for k, v in p.reasons.items() if v[j]), reverse=True)[:2]
        out.append(f"  {j:5d} {p.samples[j] / p.total * 100:5.2f}% {p.executed[j]:>11} "
                   f"{p.sass[j][:64]:64} " + " ".join(f"{k}:{v / p.total * 100:.2f}"
                                                       for v, k in why))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--compare", help="a second kernel's page, summarized after the first")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    for path in filter(None, (args.csv, args.compare)):
        print(f"== {path}\n{summary(read_page(path), args.top)}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
