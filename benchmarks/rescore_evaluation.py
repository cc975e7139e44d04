"""Re-judge a held-out regime evaluation with the current lookup rule, without a GPU.

``PYTHONPATH=. python benchmarks/rescore_evaluation.py EVAL.json TABLE.json [--loo]``: the
evaluation (``python -m tessera profile --evaluate``) timed every candidate regime on every
held-out mask, so the regime any lookup rule picks has a recorded time. ``--loo`` also prints
leave-one-out figures on the table itself (each entry predicted from the others).
"""

from __future__ import annotations

import argparse
import json

from tessera.runtime.profile import format_summary, rescore_evaluation
from tessera.runtime.regime import MaskFeatures, RegimeTable


def leave_one_out(table: RegimeTable) -> str:
    """Each entry's relative time under the regime the rest of the table picks for its key."""
    entries = table.entries
    rels = []
    for i, e in enumerate(entries):
        rest = RegimeTable(entries[:i] + entries[i + 1:], table.provenance)
        r = rest.lookup(MaskFeatures.from_dict(e["features"]))
        name = r.name if r is not None and r.name in e["candidates"] else e["default"]
        rels.append(e["candidates"][name]["rel"])
    n = len(rels)
    within = 100 * sum(x <= 1.05 for x in rels) / n
    return (f"leave-one-out over {n} entries: within 5% {within:.0f}"
            f"%, mean slowdown {100 * (sum(rels) / n - 1):.1f}%, worst x{max(rels):.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("evaluation")
    ap.add_argument("table")
    ap.add_argument("--loo", action="store_true")
    args = ap.parse_args()
    doc = json.load(open(args.evaluation))
    table = RegimeTable.load(args.table)
    print(f"recorded lookup ({doc.get('table')}):")
    print(format_summary(doc["summary"]))
    print(f"current lookup ({args.table}):")
    print(format_summary(rescore_evaluation(doc, table)["summary"]))
    if args.loo:
        print(leave_one_out(table))


if __name__ == "__main__":
    main()
