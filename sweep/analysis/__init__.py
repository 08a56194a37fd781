"""Analysis for downstream teams: lazy polars over the results tables.

Load every stored run, find Pareto fronts of speedup against agreement (full depth a candidate on
every one) and their knees, the best trial at each agreement target, bootstrap confidence
intervals over prompts, the A/A noise floor per model, and
the profile summaries (layer curve, EAS, oracle exits, tuned lens against logit lens).
``sweep analyze`` writes them as tables and a report.
"""

from sweep.analysis._confidence import (
    FLOORS,
    SPEEDUPS,
    agreement_interval,
    ranked,
    skipped_compute,
    trial_rng,
    with_confidence,
)
from sweep.analysis._load import (
    distinct_profiles,
    distinct_trials,
    load_profiles,
    load_trials,
    warn_shared_names,
)
from sweep.analysis._noise import FLOOR_TARGET, noise_floors
from sweep.analysis._pareto import (
    FULL_DEPTH_ID,
    KNEE_MIN_AGREEMENT,
    KNEE_MIN_POINTS,
    TARGETS,
    best_at_targets,
    chord_knees,
    front_gate,
    fronts,
    full_depth,
    kneedle_knee,
    knees_table,
    nondominated,
    counted,
    ok_trials,
    params_text,
    pareto_front,
)
from sweep.analysis._screen import comparison, distinct_simulated, gap_by_gate
from sweep.analysis._tasks import KEYS as TASK_KEYS
from sweep.analysis._tasks import (
    LOSS_TARGETS,
    accuracy_front,
    accuracy_targets,
    setting_name,
    stopped_task_rows,
    task_eas,
    task_trials,
)
from sweep.analysis._profiles import (
    S_VARIANTS,
    eas_per_layer,
    eas_table,
    format_summary,
    layer_curve,
    lens_curves,
    oracle_bound,
    oracle_exits,
    oracle_summary,
)

__all__ = [
    "LOSS_TARGETS",
    "accuracy_front",
    "accuracy_targets",
    "task_eas",
    "setting_name",
    "TASK_KEYS",
    "stopped_task_rows",
    "task_trials",
    "agreement_interval",
    "FLOORS",
    "FLOOR_TARGET",
    "FULL_DEPTH_ID",
    "KNEE_MIN_AGREEMENT",
    "KNEE_MIN_POINTS",
    "SPEEDUPS",
    "S_VARIANTS",
    "TARGETS",
    "best_at_targets",
    "chord_knees",
    "comparison",
    "distinct_profiles",
    "distinct_trials",
    "eas_per_layer",
    "eas_table",
    "format_summary",
    "front_gate",
    "fronts",
    "distinct_simulated",
    "gap_by_gate",
    "full_depth",
    "kneedle_knee",
    "knees_table",
    "layer_curve",
    "lens_curves",
    "load_profiles",
    "load_trials",
    "warn_shared_names",
    "noise_floors",
    "nondominated",
    "counted",
    "ok_trials",
    "oracle_bound",
    "oracle_exits",
    "oracle_summary",
    "params_text",
    "pareto_front",
    "ranked",
    "skipped_compute",
    "trial_rng",
    "with_confidence",
]
