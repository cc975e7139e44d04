"""Regimes: whole execution plans, the heuristic, mask features, regime tables and the selection
that picks one for a plan (``value``, ``heuristic``, ``features``, ``table``, ``selection``;
``slots`` counts the GPU's task slots, ``candidates`` is the profiler's search space;
``backward`` the backward pass's regimes, heuristic and candidates)."""

from .backward import (BackwardRegime, backward_regime_from_name, candidate_backward_regimes,
                       default_backward_regime)
from .candidates import candidate_regimes
from .features import (MaskFeatures, MaskMeasures, features_from_measures, mask_features,
                       mask_measures)
from .heuristic import (PACK_MIN_CHUNK_RATIO, align_may_pay, align_pays, blocks_ragged,
                        default_regime, pack_pays)
from .selection import (ENV_TABLE, active_table, aligned_pick, describe_table_in_use,
                        heuristic_choice, packed_pick, planned_pick, ring_rule_sm_count,
                        select_backward_regime, select_regime, selected_regime,
                        selection_generation, table_pick, use_table, whole_span_pick)
from .slots import plan_may_split, plan_tasks_in_flight, regime_fits, tasks_in_flight
from .table import TABLES_DIR, RegimeTable, gpu_slug, write_json_atomic
from .value import ROW_GROUP, Regime, regime_from_name

__all__ = ["Regime", "BackwardRegime", "backward_regime_from_name", "candidate_backward_regimes",
           "default_backward_regime", "select_backward_regime", "ROW_GROUP", "regime_from_name",
           "default_regime", "align_pays",
           "align_may_pay", "aligned_pick", "packed_pick", "planned_pick", "table_pick",
           "whole_span_pick",
           "heuristic_choice", "ring_rule_sm_count",
           "pack_pays", "PACK_MIN_CHUNK_RATIO", "blocks_ragged", "candidate_regimes",
           "MaskFeatures", "MaskMeasures",
           "features_from_measures", "mask_features", "mask_measures", "RegimeTable", "TABLES_DIR",
           "gpu_slug", "write_json_atomic", "ENV_TABLE", "use_table", "active_table",
           "select_regime", "selected_regime", "selection_generation", "describe_table_in_use",
           "plan_may_split", "plan_tasks_in_flight", "regime_fits", "tasks_in_flight"]
