"""Nsight Compute's PC samples of a kernel, by role and instruction class: where its warps are
when sampled. The tables "Where the 64-token head-dim-64 kernel's warps wait" and "Dense
against FlashAttention-4" of benchmarks/RESULTS.md are read this way.

Input: ``ncu --import R --page source --csv --print-source sass`` of a report taken with
``--metrics group:smsp__pcsamp_warp_stall_reasons,smsp__pcsamp_sample_count`` (PC sampling
alone takes seconds where the SourceCounters section replays a long kernel for minutes): per
kernel a ``"Kernel Name"`` line, a header naming ``"Source"`` and the sample columns, then one
row per SASS instruction. A warp-specialized kernel's producer is the code from a register
release (``USETMAXREG.DEALLOC``) to the next register claim (``USETMAXREG.TRY_ALLOC``) or the
end; the rest is the consumers'. A kernel without either is all consumers.

A report with the SourceCounters section instead (``--section SourceCounters``) is read with
``--executed``: the consumers' executed warp instructions summed by opcode, divided by
``--per`` (e.g. the launch's consumer warp-chunks), the instruction mix of RESULTS' N7.

    python3 -m tessera.tools.pc_samples src.csv [--top 8]
    python3 -m tessera.tools.pc_samples src.csv --executed --per 524288 [--top 30]
    python3 -m tessera.tools.pc_samples src.csv --column long_scoreboard [--top 8]

``--column`` reads one stall reason's samples (the report's per-reason columns) instead of all:
the lines where warps wait for that reason, and its share by role and instruction class.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from dataclasses import dataclass, field
from typing import TextIO

__all__ = ["KernelSamples", "CLASSES", "read_source_csv", "opcode", "instruction_class", "main",
           "SAMPLES", "EXECUTED"]

# Instruction classes by opcode prefix (the first that matches), in report order. A branch right
# after a barrier wait is that wait's poll loop and counts with it.
CLASSES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("exponentials", ("MUFU.EX2",)),
    ("row maxima", ("FMNMX", "SHFL")),
    ("arithmetic", ("FADD", "FMUL", "FFMA", "F2FP", "FSETP")),
    ("wgmma issue", ("HGMMA",)),
    ("wgmma waits", ("WARPGROUP.DEPBAR",)),
    ("barrier waits", ("SYNCS.PHASECHK", "NANOSLEEP")),
)

_REST = "rest"

_PREDICATE = re.compile(r"^@!?U?P[T0-9]+\s+")

# The count columns a report may carry, the first one present: PC samples (every sample, else
# the stall-reason group's sum; the SourceCounters section names them in words), or
# SourceCounters' executed warp instructions.
SAMPLES = ("smsp__pcsamp_sample_count", "group:smsp__pcsamp_warp_stall_reasons",
           "Warp Stall Sampling (All Samples)")
EXECUTED = ("Warp Instructions Executed", "Instructions Executed", "inst_executed")


def opcode(source: str) -> str:
    """The opcode of a SASS line (``"@!P0 BRA 0x..."`` -> ``"BRA"``)."""
    words = _PREDICATE.sub("", source.strip()).split()
    return words[0] if words else ""


def instruction_class(source: str, previous: str = "") -> str:
    """The class of :data:`CLASSES` a SASS line belongs to (``previous``: the line before it,
    for the branch of a barrier wait's poll loop), else ``"rest"``."""
    op = opcode(source)
    if op.startswith("BRA") and previous and instruction_class(previous) == "barrier waits":
        return "barrier waits"
    for name, prefixes in CLASSES:
        if op.startswith(prefixes):
            return name
    return _REST


@dataclass
class KernelSamples:
    """One kernel's SASS lines and the samples at each, in program order."""

    name: str
    sources: list[str] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.samples)

    def producer_lines(self) -> list[bool]:
        """Per line, whether it is the producer's (between a register release and the next
        register claim)."""
        out, inside = [], False
        for src in self.sources:
            op = opcode(src)
            if op.startswith("USETMAXREG"):
                inside = "DEALLOC" in op
            out.append(inside)
        return out

    def shares(self) -> tuple[float, dict[str, float]]:
        """The producer's share of all samples, and each class's share of the consumers'."""
        producer = self.producer_lines()
        total = self.total
        by_class = {name: 0 for name, _ in CLASSES} | {_REST: 0}
        previous = ""
        for src, n, prod in zip(self.sources, self.samples, producer):
            if not prod:
                by_class[instruction_class(src, previous)] += n
            previous = src
        consumers = sum(by_class.values())
        return ((total - consumers) / total if total else 0.0,
                {k: v / consumers if consumers else 0.0 for k, v in by_class.items()})

    def consumer_opcodes(self) -> dict[str, int]:
        """The consumers' counts summed by base opcode (``"HGMMA.64x128x16..."`` ->
        ``"HGMMA"``), most first: their instruction mix, read from an ``EXECUTED`` column."""
        totals: dict[str, int] = {}
        for src, n, prod in zip(self.sources, self.samples, self.producer_lines()):
            if not prod:
                base = opcode(src).split(".")[0]
                totals[base] = totals.get(base, 0) + n
        return dict(sorted(totals.items(), key=lambda kv: -kv[1]))

    def top(self, n: int) -> list[tuple[int, int, str]]:
        """The ``n`` lines with the most samples: (line index, samples, source)."""
        order = sorted(range(len(self.samples)), key=lambda i: -self.samples[i])
        return [(i, self.samples[i], self.sources[i].strip()) for i in order[:n]]

    def role_and_class(self, i: int) -> tuple[str, str]:
        """Line ``i``'s role ("producer" or "consumers") and instruction class, so a listed
        line reads as whose wait it is (a poll loop's branch belongs to its role's waits)."""
        role = "producer" if self.producer_lines()[i] else "consumers"
        return role, instruction_class(self.sources[i], self.sources[i - 1] if i else "")


def read_source_csv(stream: TextIO, columns: tuple[str, ...] = SAMPLES,
                    containing: str | None = None) -> list[KernelSamples]:
    """Every kernel of an ncu source-page CSV export, with its count per SASS line from the first
    of ``columns`` (``SAMPLES``: PC samples; ``EXECUTED``: executed warp instructions) the
    export has -- or, given ``containing``, from the one column whose name contains it (one stall
    reason's samples, e.g. ``"long_scoreboard"``)."""
    kernels: list[KernelSamples] = []
    source_col = sample_col = None
    for row in csv.reader(stream):
        if len(row) >= 2 and row[0] == "Kernel Name":
            kernels.append(KernelSamples(row[1]))
            source_col = sample_col = None
            continue
        if not kernels:
            continue
        if "Source" in row:
            source_col = row.index("Source")
            if containing is not None:
                found = [i for i, c in enumerate(row) if containing in c]
                if len(found) != 1:
                    raise ValueError(f"{len(found)} columns' names contain {containing!r}; "
                                     f"columns: {row}")
                sample_col = found[0]
                continue
            sample_col = next((row.index(c) for c in columns if c in row), None)
            if sample_col is None:
                what = ("no PC-sample column (take the report with --metrics "
                        f"{SAMPLES[1]})" if columns == SAMPLES else
                        f"none of the columns {columns}")
                raise ValueError(f"the source page has {what}; columns: {row}")
            continue
        if source_col is None or len(row) <= max(source_col, sample_col):
            continue
        value = row[sample_col].replace(",", "")
        if not value.isdigit():
            continue
        kernels[-1].sources.append(row[source_col])
        kernels[-1].samples.append(int(value))
    return [k for k in kernels if k.sources]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--top", type=int, default=8,
                    help="lines with the most samples to list, each with its role and class "
                         "(with --executed: opcodes to list)")
    ap.add_argument("--executed", action="store_true",
                    help="read executed warp instructions (a SourceCounters report) and print "
                         "the consumers' mix by opcode")
    ap.add_argument("--column",
                    help="rank lines by the one column whose name contains this (a stall "
                         "reason's samples, e.g. long_scoreboard) instead of all samples")
    ap.add_argument("--per", type=float, default=1.0,
                    help="with --executed: divide the counts by this (e.g. consumer "
                         "warp-chunks; default 1)")
    args = ap.parse_args(argv)
    if args.top < 0:
        ap.error(f"--top must be at least 0, got {args.top}")
    if not args.per > 0:
        ap.error(f"--per must be positive, got {args.per}")
    if args.column is not None and args.executed:
        ap.error("--column ranks PC samples; --executed reads executed instructions")
    with open(args.csv, newline="") as f:
        kernels = read_source_csv(f, EXECUTED if args.executed else SAMPLES, args.column)
    if not kernels:
        what = "executed instructions" if args.executed else "PC samples"
        print(f"{args.csv}: no kernel with {what}", file=sys.stderr)
        return 1
    if args.executed:
        for k in kernels:
            mix = k.consumer_opcodes()
            print(f"{k.name[:80]}: consumers {sum(mix.values()) / args.per:,.1f} warp "
                  f"instructions per {args.per:g}, producer "
                  f"{(k.total - sum(mix.values())) / args.per:,.1f}")
            print("  " + ", ".join(f"{op} {n / args.per:,.1f}"
                                   for op, n in list(mix.items())[:args.top]))
        return 0
    for k in kernels:
        producer, classes = k.shares()
        print(f"{k.name[:80]}: {k.total:,} samples, producer {100 * producer:.1f}%")
        print("  consumers: " + ", ".join(f"{name} {100 * v:.1f}%" for name, v in classes.items()))
        for i, n, src in k.top(args.top):
            role, cls = k.role_and_class(i)
            print(f"  line {i:5d} {100 * n / k.total:5.1f}%  {role:9s} {cls:13s} {src[:80]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
