"""Judge the run-time selection rule on a held-out evaluation, without a GPU.

``PYTHONPATH=. python benchmarks/policy_evaluation.py EVAL.json TABLE.json --heads 4|model``

``tessera.plan`` looks the regime table up only where the heuristic's plan may split tasks
(``regime.select_regime``: fewer than 16 tasks per task slot of the GPU) and keeps the heuristic
elsewhere. An evaluation (``python -m tessera profile --evaluate``) timed every candidate on
every held-out mask, so that rule's pick has a recorded time on each; this prints the summary
for the rule, for the table everywhere and for the heuristic everywhere, on the GPU the
evaluation ran on (its SM count from the evaluation's provenance).
"""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace

from tessera.runtime.profile import (HELDOUT_SHAPES, format_summary, profile_shapes,
                                     summarize_evaluation)
from tessera.runtime.regime import (MaskFeatures, RegimeTable, plan_may_split,
                                    regime_from_name, tasks_in_flight)


def model_heads(shape: str) -> int:
    """Heads of a profile or held-out shape at its model's own count."""
    if shape in HELDOUT_SHAPES:
        return int(HELDOUT_SHAPES[shape]["heads"])
    return int(profile_shapes()[shape].heads)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("evaluation")
    ap.add_argument("table")
    ap.add_argument("--heads", default="4", help="the corpus's heads per mask, or 'model'")
    args = ap.parse_args()
    doc = json.load(open(args.evaluation))
    table = RegimeTable.load(args.table)
    sms = int(doc["provenance"]["sms"])
    arch = int(doc["arch"])
    policies: dict[str, list[dict]] = {"rule": [], "table everywhere": [],
                                       "heuristic everywhere": []}
    looked_up = 0
    for r in doc["records"]:
        feats = MaskFeatures.from_key(r["key"])
        heads = model_heads(r["shape"]) if args.heads == "model" else int(args.heads)
        heuristic = regime_from_name(r["default"])
        found = table.lookup(feats)
        table_pick = found.name if found is not None else r["default"]
        # What the rule reads of a mask: its stored heads and query length (the corpus's masks
        # carry one mask head per query head, batch 1).
        mask = SimpleNamespace(batch_heads=(1, heads), seq_len_q=int(r["measures"]["seq_len"]))
        split = plan_may_split(heuristic, mask, num_q_heads=heads, num_kv_heads=heads, batch=1,
                               in_flight=tasks_in_flight(heuristic, feats.head_dim, arch, sms))
        looked_up += split
        for name, pick in (("rule", table_pick if split else r["default"]),
                           ("table everywhere", table_pick),
                           ("heuristic everywhere", r["default"])):
            if pick not in r["times"]:
                raise SystemExit(f"{r['label']}: {name} picks {pick}, which was not timed")
            policies[name].append({**r, "chosen": pick})
    n = len(doc["records"])
    print(f"{args.evaluation}: {n} masks, {looked_up} where the heuristic's plan may split "
          f"(table looked up), {n - looked_up} sync-free (heuristic), {sms} SMs")
    for name, records in policies.items():
        print(f"== {name}")
        print(format_summary(summarize_evaluation(records, doc.get("objective", "request"))))


if __name__ == "__main__":
    main()
