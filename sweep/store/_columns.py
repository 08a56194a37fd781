"""The results contract's building blocks: columns, tables, the provenance every row carries,
the gate setting's columns (from the gate-spec table) and the schema version.

The tables themselves are declared in ``_trials.py`` (bench trials) and ``_tables.py`` (the
profile trace and the derived tables); ``_schema.py`` lists them all and renders docs/schema.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import polars as pl

from sweep.gates import GATES, PARAMS, ParamSpec

# 2: layers_saved counts decode steps only (the first token saves nothing)
# 3: trials carry trial_key, the JSON text that trial_id hashes
# 4: partition columns live in the directory names only (not in the files); every table in its own
#    directory (pareto, knees, targets: <root>/<table>/<table>.parquet); units and meanings in the Parquet
#    field metadata; pareto and knees carry `front` (model | model+gate) instead of `scope` / gate `all`,
#    knees the knee's typed gate setting instead of knee_gate / knee_params text
# 5: trials carry baseline_shared (settings timed against one shared baseline per round); a gate setting
#    carries lens (tuned or null); trials carry readouts_id and fit_prompts; the classifier gate
# 6: trials carry setup_seconds (the untimed work of bench_seconds); a shared baseline's group apportions its
#    time to its rows by their timed rounds' seconds
# 7: every row carries the model's kind (attention | ssm | hybrid), the adapter path its K/V fill takes
#    and the fidelity check's errors at load; family is the decoder's HF model_type (any decoder-only LM)
# 8: trials carry the A/A control (speedup_aa, speedup_e2e_aa, noise_floor, noise_floor_e2e, round_aa_*);
#    the ranked `speedup` is capped at 1.0 from above only (a trial that skipped no compute keeps a measured
#    slowdown) and is 1.0 inside the trial's noise floor (capped, within_noise, speedup_floor); pareto and targets
#    hold the full-depth reference (trial_id `full-depth`) and name a front by front_gate; knees are taken over
#    front points with agreement >= analysis.knee_min_agreement, the unrestricted knee beside them
# 9: trials carry skip-set self-speculation (gate=skip: skip, skip_ratio; draft_stop, acceptance_length,
#    draft_ms_per_token, verify_ms_per_token); self-speculative rows carry the cost model's speedup_model
# 10: trials carry reference_source (fresh: the trial took its full-depth reference; cached: a sweep worker's,
#    sweep.reuse); every trial runs one protocol (a trial alone is a group of one), so a `sweep bench` trial's
#    gated reference is its first timed round's gated run, as in a sweep
# 11: trials carry cost_model_source (fresh, or cached: the cost model kept per machine, sweep.bench.costs_cache)
# 12: status `stopped` (search.min_agreement: a setting stopped after its first prompts), with stopped_at_prompts
#    and stop_agreement_hi
# 13: trials carry a task's accuracy beside agreement (eval.task: task, task_metric, accuracy, accuracy_full,
#    accuracy_loss and their bootstrap intervals over problems, per-problem scores, completions, pass_at_k, sandbox)
# 14: every row carries the environment fingerprint (env_cpu, env_cores, env_threads, env_torch_threads, env_gpu,
#    env_gpu_memory_gib, cuda_version, attn_implementation) and the fidelity check (e)'s fidelity_rollback_err;
#    self-speculative trials carry acceptance_by_position, accepted_length_hist and prompt_acceptance; trials carry
#    prompt_categories
# 15: stopped trials carry their stopping rule (stop_min_agreement, stop_rung_prompts); a task's gated side stopped
#    by search.max_accuracy_loss carries accuracy_loss_min (its accuracy and loss then null)
# 16: the analysis tables' ci_units (the units the speedup interval resampled: a batched trial's batches), and
#    ci_few_prompts set when either interval has fewer than analysis.ci_min_prompts units
SCHEMA_VERSION = 16


@dataclass(frozen=True)
class Column:
    name: str
    dtype: pl.DataType
    unit: str
    meaning: str
    nullable: bool = False
    # the schema version that added the column: a reader requires a non-nullable column only of files
    # written under that version or later (a non-nullable column added later bumps SCHEMA_VERSION)
    since: int = 1
    # a gate parameter whose unit depends on the gate: ((gate, unit), ...); ``unit`` then says "per gate"
    unit_by_gate: tuple[tuple[str, str], ...] = ()

    def field_metadata(self) -> dict[str, str]:
        """The column's Parquet (Arrow) field metadata: ``unit`` and ``description`` (and
        ``unit_by_gate``, JSON ``{gate: unit}``, where the unit depends on the gate)."""
        meta = {"unit": self.unit, "description": self.meaning}
        if self.unit_by_gate:
            meta["unit_by_gate"] = json.dumps(dict(self.unit_by_gate))
        return meta


@dataclass(frozen=True)
class Table:
    name: str
    partition_by: tuple[str, ...]  # hive directories, in order: root/<table>/<col>=<value>/...
    unit_of_work: str  # what one file holds
    description: str
    columns: tuple[Column, ...]
    single_file: bool = False  # a derived table: one file <root>/<name>/<name>.parquet, replaced by each writer
    # many small files (one per unit of work): from CACHE_FROM files on, readers keep their rows in a cache (_cache)
    cached: bool = False

    @property
    def schema(self) -> pl.Schema:
        return pl.Schema({c.name: c.dtype for c in self.columns})

    @property
    def file_columns(self) -> tuple[Column, ...]:
        """The columns stored in each file: all but the partition columns (those are the directory names)."""
        return tuple(c for c in self.columns if c.name not in self.partition_by)


PROVENANCE: tuple[Column, ...] = (
    Column("schema_version", pl.Int32(), "", "version of this schema the row was written under"),
    Column("run_id", pl.String(), "", "id of the command run that wrote the row"),
    Column("created_at", pl.Datetime("us", "UTC"), "UTC", "when the row's file was written"),
    Column("model", pl.String(), "", "model label (conf/model name or derived from model.path)"),
    Column("model_source", pl.String(), "", "packaged | gguf | hf | tiny"),
    Column(
        "model_hash",
        pl.String(),
        "",
        "content hash of the weights (sha256 of the file, sampled above 256 MiB; hub:ID@commit for hub models)",
    ),
    Column("model_revision", pl.String(), "", "hub commit or revision, null when not from a hub", nullable=True),
    Column(
        "family",
        pl.String(),
        "",
        "the decoder's HF model_type, '_text' dropped (llama, gemma3, mixtral, mamba, ...; the README's family table)",
    ),
    Column(
        "model_kind",
        pl.String(),
        "",
        "attention (every layer caches K/V) | ssm (state-space layers only) | hybrid (both); null when the "
        "model never loaded",
        nullable=True,
    ),
    Column(
        "adapter_path",
        pl.String(),
        "",
        "how the engine fills a skipped layer's K/V (kv_policy=propagate): fast (the stacked projection of "
        "sweep/config/families.py) | generic (the layer's own modules) | none (no fill is exact: propagate refused); "
        "null when the model never loaded",
        nullable=True,
    ),
    Column(
        "fidelity_lens_err",
        pl.Float64(),
        "ratio",
        "fidelity check at load (a): max |logit lens at layer L - the model's own logits| / max |logits|; "
        "above the dtype's tolerance every exiting gate is refused",
        nullable=True,
    ),
    Column(
        "fidelity_kv_err",
        pl.Float64(),
        "ratio",
        "fidelity check (b): max relative error of the K/V fill against each attention layer's own cache, on "
        "the adapter path taken (the smaller one when no path passed); null for a model without K/V layers",
        nullable=True,
    ),
    Column(
        "fidelity_step_err",
        pl.Float64(),
        "ratio",
        "fidelity check (c): max relative error of a decode step through the adapter (cache, layer wrappers) "
        "against the model's own forward over the whole sequence",
        nullable=True,
    ),
    Column(
        "fidelity_batch_err",
        pl.Float64(),
        "ratio",
        "fidelity check (d): max relative error of a left-padded batch of two prompts (prefill and one step) "
        "against each decoded alone; above the tolerance bench.batch_size > 1 is refused",
        nullable=True,
    ),
    Column(
        "fidelity_rollback_err",
        pl.Float64(),
        "ratio",
        "fidelity check (e): max relative error of the cache and the next step after self-speculation's roll-backs "
        "(3 drafts stepped and rolled back, verified and rolled back to 1 accepted) against a fresh forward over "
        "the accepted sequence; above 1e-5 (float32) self-speculation is refused",
        nullable=True,
    ),
    Column(
        "attn_implementation",
        pl.String(),
        "",
        "the attention implementation the model ran: eager | sdpa | flash_attention_2 | ... (none: no attention)",
        nullable=True,
    ),
    Column("num_layers", pl.Int32(), "layers", "L, the number of decoder layers"),
    Column("device", pl.String(), "", "cpu or cuda:N (GPU name)"),
    Column("dtype", pl.String(), "", "weights and activations dtype"),
    Column("seed", pl.Int64(), "", "config seed"),
    Column("git_sha", pl.String(), "", "project commit, '-dirty' when the checkout had changes"),
    Column(
        "submission_id",
        pl.String(),
        "",
        "Ray job submission id of the job that wrote the row (jobs/submit.py); null outside a Ray job",
        nullable=True,
    ),
    Column("sweep_version", pl.String(), "", "version of this package"),
    Column("torch_version", pl.String(), "", "torch version"),
    Column("transformers_version", pl.String(), "", "transformers version"),
    Column("python_version", pl.String(), "", "Python version"),
    # the environment fingerprint (sweep.config.provenance.machine): the report warns when a front's rows differ
    Column("env_cpu", pl.String(), "", "CPU model (/proc/cpuinfo's model name)", nullable=True),
    Column("env_cores", pl.Int32(), "cores", "physical CPU cores of the machine", nullable=True),
    Column("env_threads", pl.Int32(), "threads", "logical CPUs (hardware threads) of the machine", nullable=True),
    Column("env_torch_threads", pl.Int32(), "threads", "intra-op threads torch used", nullable=True),
    Column("env_gpu", pl.String(), "", "GPU name; null without one", nullable=True),
    Column("env_gpu_memory_gib", pl.Float64(), "GiB", "GPU memory; null without a GPU", nullable=True),
    Column("cuda_version", pl.String(), "", "CUDA version torch was built with; null for a CPU build", nullable=True),
)


# a gate setting, as trials and simulated rows carry it: the parameter columns come from the
# gate-spec table (sweep.gates), so a new gate parameter is a new column of every table here
def _gate_column(param: ParamSpec) -> Column:
    takers = [g for g in GATES if param.name in g.accepts]
    names = [g.name for g in takers]
    unset = "gates that do not take it" if len(names) > 2 else "gates other than " + " and ".join(names)
    meaning = param.meaning if "null" in param.meaning else f"{param.meaning}; null for {unset}"
    units = tuple((g.name, g.unit(param.name)) for g in takers)
    per_gate = len({u for _, u in units}) > 1
    unit = "per gate: " + ", ".join(f"{u} ({g})" for g, u in units) if per_gate else param.unit
    return Column(
        param.name,
        {int: pl.Int32(), float: pl.Float64(), str: pl.String()}[param.type],
        unit,
        meaning,
        nullable=True,
        unit_by_gate=units if per_gate else (),
    )


GATE_FIELDS: tuple[Column, ...] = (
    (
        Column(
            "gate",
            pl.String(),
            "",
            "gate name: a registered gate (conf/gate/NAME.yaml; `sweep bench --help` lists them)",
        ),
        Column(
            "min_layer",
            pl.Int32(),
            "",
            "first layer after which the gate may exit (resolved from min_depth when set); null on a failed row whose "
            "model never loaded when the setting gave min_depth (no depth to resolve it against)",
            nullable=True,
        ),
        Column(
            "min_depth",
            pl.Float64(),
            "fraction",
            "min_layer as a fraction of depth, when the setting gave it that way",
            nullable=True,
        ),
    )
    + tuple(_gate_column(p) for p in PARAMS.values())
    + (
        Column(
            "lens",
            pl.String(),
            "",
            "the readout the gate's probes and exit token use when it is not the logit lens: tuned (a fitted "
            "tuned-lens translator first, `sweep fit`); null = the logit lens (the model's final norm and head)",
            nullable=True,
        ),
    )
)


def metric(name: str, unit: str, meaning: str, dtype: pl.DataType | None = None) -> Column:
    return Column(name, dtype if dtype is not None else pl.Float64(), unit, meaning, nullable=True)
