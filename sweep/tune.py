"""Every Ray and Optuna call of the project, in one place.

`sweep run` composes the config on the driver, starts an embedded Ray bound to 127.0.0.1
(or joins a cluster), and runs bench trials through Ray Tune: a grid, or Optuna as the
search algorithm (its study persisted in SQLite beside Tune's experiment). Each trial is a
list of Hydra overrides; a worker composes it, reuses its process's model (one load per
worker), runs the bench and reports the row; the driver is the single writer of the rows.

Importing this module imports Ray: call ``sweep.cluster_env.ray_environment`` first, since
Ray reads its auth mode and single-node mode when it is imported.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import polars as pl
import ray
from ray import tune
from ray.tune.search import ConcurrencyLimiter
from ray.tune.search.optuna import OptunaSearch

from sweep.config import ClusterConfig, Config, SearchConfig, compose
from sweep.errors import ConfigError, SweepError
from sweep.gates import GATES
from sweep.search import METRICS, Param, as_override, check_search, grid, spaces

log = logging.getLogger("sweep.tune")

DONE_STATUSES = ("ok", "nondeterministic")  # rows that count as done; failed trials are redone


# ---------------------------------------------------------------- search-space mapping


def distributions(param: Param) -> tuple[Any, Any]:
    """One parameter as (Ray Tune domain, Optuna distribution): the single mapping function."""
    if param.kind == "fixed":
        return param.values[0], optuna.distributions.CategoricalDistribution(list(param.values))
    if param.kind == "choice":
        return tune.choice(list(param.values)), optuna.distributions.CategoricalDistribution(list(param.values))
    if param.integer:
        low, high = int(param.low), int(param.high)
        domain = tune.lograndint(low, high + 1) if param.log else tune.randint(low, high + 1)
        return domain, optuna.distributions.IntDistribution(low, high, log=param.log)
    domain = tune.loguniform(param.low, param.high) if param.log else tune.uniform(param.low, param.high)
    return domain, optuna.distributions.FloatDistribution(float(param.low), float(param.high), log=param.log)


class DefineByRun:
    """An Optuna define-by-run space: pick a sub-space, then suggest its parameters.

    A class rather than a closure: Tune pickles the searcher into its experiment state.
    """

    def __init__(self, subspaces: list[list[Param]]) -> None:
        self.subspaces = subspaces

    def __call__(self, trial) -> dict:
        index = 0
        if len(self.subspaces) > 1:
            index = trial.suggest_categorical("subspace", list(range(len(self.subspaces))))
        overrides = []
        for param in self.subspaces[index]:
            if param.kind == "fixed":
                overrides.append(as_override(param.key, param.values[0]))
                continue
            _, dist = distributions(param)
            name = f"s{index}:{param.key}"
            if isinstance(dist, optuna.distributions.CategoricalDistribution):
                value = trial.suggest_categorical(name, list(dist.choices))
            elif isinstance(dist, optuna.distributions.IntDistribution):
                value = trial.suggest_int(name, dist.low, dist.high, log=dist.log)
            else:
                value = trial.suggest_float(name, dist.low, dist.high, log=dist.log)
            overrides.append(as_override(param.key, value))
        return {"trial": overrides}


# ---------------------------------------------------------------- Ray


def start_ray(cluster: ClusterConfig) -> bool:
    """Start an embedded Ray on 127.0.0.1 or join ``cluster.address``; True if started here."""
    # Tune warns about every unfinished trial of an interrupted experiment; resume handles them
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    if ray.is_initialized():
        return False
    if os.environ.get("RAY_AUTH_MODE") != cluster.auth:
        raise SweepError(f"cluster.auth={cluster.auth}: Ray was imported with RAY_AUTH_MODE={os.environ.get('RAY_AUTH_MODE')}; set it before Ray is imported")
    if cluster.address is None:
        import ray._private.ray_constants as ray_constants

        ray_constants.ENABLE_RAY_CLUSTER = False  # single-node mode: servers on 127.0.0.1
        ray.init(
            address="local",
            num_cpus=cluster.num_cpus,
            num_gpus=cluster.num_gpus,
            include_dashboard=cluster.dashboard,
            dashboard_host="127.0.0.1",
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
    else:
        _require_reachable(cluster.address)
        try:
            ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ConfigError(f"cluster.address={cluster.address}: cannot join a Ray cluster there ({str(exc).splitlines()[0]})") from None
    return True


def _require_reachable(address: str) -> None:
    """Fail in seconds, not minutes of retries, when nothing answers at the cluster address."""
    import socket

    resolved = address
    if address == "auto":
        try:
            resolved = ray._private.services.canonicalize_bootstrap_address_or_die("auto")
        except ConnectionError as exc:
            raise ConfigError(f"cluster.address=auto: no running Ray cluster found on this machine ({str(exc).splitlines()[0]})") from None
    host, _, port = resolved.split("://")[-1].rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except (OSError, ValueError):
        raise ConfigError(f"cluster.address={address}: nothing answers at {resolved}; start the cluster or fix the address (host:port of the GCS)") from None


def stop_ray() -> None:
    ray.shutdown()


def trial_resources(cfg: Config) -> dict[str, float]:
    """CPUs and GPUs per trial, checked against the cluster before any trial starts.

    A request the cluster can never satisfy would leave trials PENDING forever.
    """
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    gpus_per_node = [n["Resources"].get("GPU", 0.0) for n in nodes]
    cpus_per_node = [n["Resources"].get("CPU", 0.0) for n in nodes]
    gpu = cfg.resources.gpu
    if gpu == "auto":
        gpu = 1.0 if max(gpus_per_node, default=0) >= 1 and cfg.device != "cpu" else 0.0
    if gpu > max(gpus_per_node, default=0.0):
        raise ConfigError(
            f"resources.gpu={cfg.resources.gpu}: no node of this cluster has {gpu:g} GPU(s) "
            f"(GPUs per node: {gpus_per_node or [0]}); use resources.gpu=0 or gpu=auto"
        )
    if cfg.device == "cuda" and gpu == 0:
        raise ConfigError("device=cuda: this sweep gives trials no GPU (resources.gpu=0 and the cluster has none); use device=cpu or auto")
    if cfg.resources.cpu > max(cpus_per_node, default=0.0):
        raise ConfigError(
            f"resources.cpu={cfg.resources.cpu:g}: no node of this cluster has that many CPUs (CPUs per node: {cpus_per_node})"
        )
    return {"cpu": float(cfg.resources.cpu), "gpu": float(gpu)}


# ---------------------------------------------------------------- the trial (runs in a worker)


def _merge(base: list[str], trial: list[str]) -> list[str]:
    """Trial overrides replace base overrides of the same key."""
    keys = {o.split("=", 1)[0].lstrip("+~") for o in trial}
    return [o for o in base if o.split("=", 1)[0].lstrip("+~") not in keys] + list(trial)


def _trainable(config: dict, base: list[str] = (), context: dict | None = None) -> None:
    """One trial in a Ray worker: compose, bench (with this process's cached model), report."""
    from sweep.bench import failed_row, prepare, run_trial, trial_id
    from sweep.models import model_loads
    from sweep.run_info import provenance, provenance_unloaded

    t0 = time.perf_counter()
    context = context or {}
    try:
        cfg = compose(_merge(list(base), config["trial"]))
        tid = trial_id(cfg)
    except SweepError as exc:  # a value the driver's checks could not foresee: no config, so no row
        tune.report({**_metrics({"status": "failed"}), "error": str(exc), "cached": False})
        return
    cached = context.get("done", {}).get(tid)
    if cached is not None:  # a row from an earlier run: report it again, do not redo the work
        tune.report({**_metrics(cached), "row_json": json.dumps(cached, default=str), "cached": True})
        return
    lm = gate = None
    try:
        lm, gate, prompts = prepare(cfg)
        row = run_trial(cfg, lm, gate, prompts)
    except (SweepError, RuntimeError, ValueError, OSError) as exc:
        row = failed_row(cfg, cfg.prompts.n or 0, exc, gate)
    prov = provenance(cfg, lm, context["run_id"]) if lm is not None else provenance_unloaded(cfg, context["run_id"])
    row = {
        **prov,
        **row,
        "sweep_name": context.get("sweep_name"),
        "worker_pid": os.getpid(),
        "worker_model_loads": model_loads(),
        "trial_seconds": time.perf_counter() - t0,
    }
    tune.report({**_metrics(row), "row_json": json.dumps(row, default=str), "cached": False})


def _metrics(row: dict) -> dict:
    """What the searcher sees: objectives of ok trials; None for others (Optuna marks them failed)."""
    ok = row.get("status") == "ok"
    return {"status": row.get("status"), **{m: (row.get(m) if ok else None) for m in METRICS}}


# ---------------------------------------------------------------- the driver


@dataclass
class SweepOutcome:
    name: str
    path: str
    root: str
    total: int
    skipped: int
    rows: list[dict] = field(default_factory=list)
    overhead_s: list[float] = field(default_factory=list)
    interrupted: bool = False
    simulated: Any = None  # search=screen: the simulated settings (a polars DataFrame)


def run_sweep(cfg: Config, base_overrides: list[str]) -> SweepOutcome:
    """`sweep run`: plan the trials, start or join Ray, run them through Tune, write rows."""
    from sweep.run_info import new_run_id

    check_search(cfg.search)
    if cfg.sweep.storage is not None and "://" in cfg.sweep.storage:
        raise ConfigError(f"sweep.storage={cfg.sweep.storage}: a filesystem path is needed (a shared mount on a cluster)")
    run_id = cfg.run_id or new_run_id()
    root = Path(cfg.results.root).expanduser().resolve()
    cfg = dataclasses.replace(cfg, results=dataclasses.replace(cfg.results, root=str(root)))
    storage = Path(cfg.sweep.storage or root / "ray").expanduser().resolve()
    name = _sweep_name(cfg, storage, run_id)
    base = [o for o in base_overrides if o.split("=", 1)[0] not in ("resume", "sweep.name", "run_id", "results.root")]
    base += [f"run_id={run_id}", f"results.root={root}"]
    if "RAY_JOB_CONFIG_JSON_ENV_VAR" in os.environ:
        # inside a Ray job the working directory can be re-extracted under the driver; stand elsewhere
        storage.mkdir(parents=True, exist_ok=True)
        os.chdir(storage)
    grid_trials = _check_values(cfg, base)  # bad values fail here, before Ray starts
    done = _done_rows(cfg)
    started = start_ray(cfg.cluster)
    simulated = None
    try:
        resources = trial_resources(cfg)
        device = "cuda" if cfg.device == "cuda" or (cfg.device == "auto" and resources["gpu"] > 0) else "cpu"
        if cfg.search.kind == "screen" and not cfg.resume:
            grid_trials, simulated = _screen(cfg, base, grid_trials, resources, device, name, run_id)
        planned, skipped = _select(grid_trials, done, device, cfg.results.root)
        total = len(planned) if planned is not None else cfg.search.n_trials
        if planned == [] and not cfg.resume:
            log.info("sweep %s: nothing to run", name)
            return SweepOutcome(name, str(storage / name), str(root), 0, skipped, simulated=simulated)
        writer = RowWriter(str(root), total, base, run_id, name)
        tuner = _tuner(cfg, base, planned, done, resources, storage, name, run_id, Progress(writer))
        log.info("sweep %s: %s trials on %s (%s per trial); Tune state in %s", name, total, _cluster_label(cfg.cluster), resources, storage / name)
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's reporter at verbose=0 prints nothing; progress is ours
        results = tuner.fit()
        unfinished = 0
        for result in results:  # rows Tune holds that no callback wrote (trials finished before a restore)
            if result.metrics and "row_json" in result.metrics:
                writer.write(json.loads(result.metrics["row_json"]))
            elif result.error is None and not (result.metrics and "status" in result.metrics):
                unfinished += 1
        interrupted = unfinished > 0 or len(results) < (total or 0)
    finally:
        if started:
            stop_ray()
    return SweepOutcome(name, str(storage / name), str(root), total or 0, skipped, writer.rows, writer.overheads, interrupted, simulated)


def _sweep_name(cfg: Config, storage: Path, run_id: str) -> str:
    if cfg.sweep.name is not None:
        if cfg.resume and not (storage / cfg.sweep.name).is_dir():
            raise ConfigError(f"sweep.name={cfg.sweep.name}: no sweep of that name under {storage} to resume")
        return cfg.sweep.name
    if not cfg.resume:
        return f"{cfg.search.name}-{run_id}"
    earlier = sorted(storage.glob(f"{cfg.search.name}-*"), key=lambda p: p.stat().st_mtime) if storage.is_dir() else []
    if not earlier:
        raise ConfigError(f"resume=true: no earlier sweep of search={cfg.search.name} under {storage}; pass sweep.name=NAME")
    return earlier[-1].name


def _done_rows(cfg: Config) -> dict[str, dict]:
    """Rows already under results.root that count as done, by trial id (unless sweep.rerun)."""
    import polars as pl

    from sweep.store import scan

    if cfg.sweep.rerun:
        return {}
    rows = scan("trials", cfg.results.root).filter(pl.col("status").is_in(DONE_STATUSES)).collect()
    return {r["trial_id"]: r for r in rows.sort("created_at").iter_rows(named=True)}


def _check_values(cfg: Config, base: list[str]) -> list[tuple[list[str], Config]] | None:
    """Compose every grid trial (returned with its config), or for Optuna both ends of every
    interval and every choice, so that a bad value fails before Ray starts. A screen's dense
    grid is composed the fast way (``sweep.screen.dense_settings``)."""
    if cfg.search.kind == "grid":
        return [(trial, compose(_merge(base, trial))) for trial in grid(cfg.search)]
    if cfg.search.kind == "screen":
        from sweep.screen import dense_settings

        return dense_settings(cfg, base, _merge)
    for params in spaces(cfg.search):
        fixed = [as_override(p.key, p.values[0]) for p in params if p.kind == "fixed"]
        for p in params:
            values = p.values if p.kind == "choice" else (p.low, p.high) if p.kind == "interval" else ()
            for value in values:
                compose(_merge(base, [*fixed, as_override(p.key, value)]))
    return None


def _screen(cfg: Config, base: list[str], settings, resources: dict, device: str, name: str, run_id: str):
    """Profile the model once (in a worker with the trials' resources), replay every setting
    on the trace, write the simulated rows, and return the settings to run closed-loop."""
    from sweep.bench import trial_id
    from sweep.costs import CostModel
    from sweep.screen import select
    from sweep.simulate import signals_from_trace, simulate
    from sweep.store import write_table

    t0 = time.perf_counter()
    task = ray.remote(num_cpus=resources["cpu"], num_gpus=resources["gpu"])(_screen_trace)
    probes = sorted({c.gate for _, c in settings if GATES.get(c.gate.name, key="gate").probe not in ("none", "hidden", "lens")}, key=str)
    try:
        result = ray.get(task.remote(base, run_id, probes))
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause if isinstance(getattr(exc, "cause", None), SweepError) else None
        if cause is not None:
            raise cause from None
        raise
    trace, prov = result["trace"], result["provenance"]
    write_table("profile", trace, root=cfg.results.root, provenance=prov, stem=f"{run_id}-screen")
    t1 = time.perf_counter()
    signals = signals_from_trace(trace)
    table = simulate([c.gate for _, c in settings], signals, CostModel(**result["costs"]), cfg.bench.kv_policy)
    t2 = time.perf_counter()
    first = settings[0][1]
    table = table.with_columns(
        trial_id=pl.Series([trial_id(c, device) for _, c in settings]),
        min_depth=pl.Series([c.gate.min_depth for _, c in settings], dtype=pl.Float64),
        model=pl.lit(prov["model"]),
    )
    table = select(table, cfg.search.neighbours)
    rows = table.with_columns(
        source=pl.lit("simulated"), sweep_name=pl.lit(name), trace_run_id=pl.lit(prov["run_id"]),
        kv_policy=pl.lit(cfg.bench.kv_policy), prompt_set=pl.lit(first.prompts.name),
        n_prompts=pl.lit(len(signals.prompt_ids)), gen_tokens=pl.lit(first.bench.gen_tokens), positions=pl.lit(signals.positions),
    )
    write_table("simulated", rows, root=cfg.results.root, provenance={k: v for k, v in prov.items() if k != "model"}, stem=name)
    chosen = [s for s, keep in zip(settings, table["selected"].to_list()) if keep]
    log.info(
        "screen: traced %d prompts (%d decision positions) in %.1f s; simulated %d settings in %.2f s; %d on the simulated front, "
        "%d run closed-loop (a grid of the same resolution: %d trials)",
        len(signals.prompt_ids), signals.positions, t1 - t0, len(settings), t2 - t1, int(table["on_front"].sum()), len(chosen), len(settings),
    )
    return chosen, table


def _screen_trace(base: list[str], run_id: str, probe_gates: list = ()) -> dict:
    """In a worker: the profile trace of the sweep's model and prompts at the bench's length,
    and the cost model (with the probes of ``probe_gates``), on the device trials will use."""
    import dataclasses as dc

    from sweep.bench import prepare
    from sweep.config import GateConfig
    from sweep.costs import cost_model
    from sweep.gates import make_gate
    from sweep.profile import traced_run

    cfg = compose(base)
    cfg = dc.replace(cfg, gate=GateConfig())  # the model's own depth decides every layer index later
    lm, _, prompts = prepare(cfg)
    trace, prov = traced_run(cfg, lm, prompts, run_id, cfg.bench.gen_tokens)
    gates = [make_gate(g, lm.num_layers) for g in probe_gates]
    return {"trace": trace, "provenance": prov, "costs": cost_model(lm, prompts[0].input_ids, gates=gates).as_dict()}


def _select(grid_trials, done: dict, device: str, root: str) -> tuple[list[list[str]] | None, int]:
    """Grid trials still to run: not already done, each trial id once."""
    from sweep.bench import trial_id

    if grid_trials is None:
        return None, 0
    todo, seen, skipped = [], set(), 0
    for trial, trial_cfg in grid_trials:
        tid = trial_id(trial_cfg, device)
        if tid in done:
            skipped += 1
        elif tid not in seen:
            seen.add(tid)
            todo.append(trial)
    if skipped:
        log.info("skipping %d trials whose rows exist under %s (sweep.rerun=true redoes them)", skipped, root)
    return todo, skipped


def _tuner(cfg: Config, base, planned, done, resources, storage: Path, name: str, run_id: str, callback):
    context = {"run_id": run_id, "sweep_name": name, "done": {} if planned is not None else done}
    trainable = tune.with_resources(tune.with_parameters(_trainable, base=base, context=context), resources)
    path = storage / name
    if cfg.resume:
        if not tune.Tuner.can_restore(str(path)):
            raise ConfigError(f"sweep.name={name}: {path} holds no restorable Tune experiment")
        log.info("resuming sweep %s from %s", name, path)
        tuner = tune.Tuner.restore(str(path), trainable=trainable, resume_errored=True)
        # callbacks are restored from the pickled state; this run's writer must replace them
        internal = getattr(tuner, "_local_tuner", None)
        if internal is None or not hasattr(internal, "_run_config"):
            raise SweepError("resume: this Ray release keeps a Tuner's callbacks elsewhere; sweep/tune.py needs updating")
        internal._run_config.callbacks = [callback]
        return tuner
    run_config = tune.RunConfig(
        name=name,
        storage_path=str(storage),
        failure_config=tune.FailureConfig(max_failures=cfg.sweep.max_failures),
        callbacks=[callback],
        verbose=0,
    )
    if planned is not None:
        param_space = {"trial": tune.grid_search(planned)}
        tune_config = tune.TuneConfig(
            max_concurrent_trials=cfg.sweep.max_concurrent, reuse_actors=True, trial_dirname_creator=_trial_dirname
        )
        return tune.Tuner(trainable, param_space=param_space, tune_config=tune_config, run_config=run_config)
    search_alg = _optuna_search(cfg.search, path)
    if cfg.sweep.max_concurrent is not None:
        search_alg = ConcurrencyLimiter(search_alg, max_concurrent=cfg.sweep.max_concurrent)
    # metric and mode live on the searcher only: TuneConfig(metric=, mode=) would make it single-objective
    tune_config = tune.TuneConfig(
        search_alg=search_alg, num_samples=cfg.search.n_trials, reuse_actors=True, trial_dirname_creator=_trial_dirname
    )
    return tune.Tuner(trainable, tune_config=tune_config, run_config=run_config)


def _trial_dirname(trial) -> str:
    return f"trial_{trial.trial_id}"


def optuna_storage_url(path: Path) -> str:
    return f"sqlite:///{path / 'optuna.db'}"


class ConstrainedOptunaSearch(OptunaSearch):
    """OptunaSearch that sets Optuna constraints (``metric >= bound`` as ``bound - metric <= 0``)
    on each finished trial, records the constrained metrics as user attributes, and tells the
    study that a trial which is not ``ok`` failed (rather than leaving it running)."""

    def __init__(self, *args, constraints: dict[str, float] | None = None, **kwargs) -> None:
        self._bounds = dict(constraints or {})
        super().__init__(*args, **kwargs)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        ot_trial = self._ot_trials.get(trial_id)
        if ot_trial is not None and result:
            if result.get("status") != "ok":
                result, error = None, True
            else:
                for metric, bound in self._bounds.items():
                    ot_trial.set_user_attr(metric, float(result[metric]))
                    ot_trial.set_constraint(metric, float(bound) - float(result[metric]))
        super().on_trial_complete(trial_id, result=result, error=error)


def _optuna_search(search: SearchConfig, path: Path) -> ConstrainedOptunaSearch:
    """OptunaSearch over the define-by-run space, seeded, its study persisted in SQLite."""
    samplers = {"tpe": optuna.samplers.TPESampler, "nsga2": optuna.samplers.NSGAIISampler, "random": optuna.samplers.RandomSampler}
    sampler = samplers[search.sampler](seed=search.seed)
    path.mkdir(parents=True, exist_ok=True)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    metrics = list(search.objectives)
    modes = [search.objectives[m] for m in metrics]
    return ConstrainedOptunaSearch(
        constraints=dict(search.constraints),
        space=DefineByRun(spaces(search)),
        metric=metrics if len(metrics) > 1 else metrics[0],
        mode=modes if len(modes) > 1 else modes[0],
        sampler=sampler,
        study_name=search.name,
        storage=optuna.storages.RDBStorage(optuna_storage_url(path)),
    )


def _cluster_label(cluster: ClusterConfig) -> str:
    return "an embedded Ray on 127.0.0.1" if cluster.address is None else f"the Ray cluster at {cluster.address}"


class RowWriter:
    """On the driver: the single writer of trial rows, and the progress lines.

    Wrapped in a Tune callback by ``_callback``; also writes the rows Tune holds at the end
    that a callback never saw (a restored sweep's), and failed rows for trials that errored.
    """

    def __init__(self, root: str, total: int | None, base: list[str], run_id: str, sweep_name: str) -> None:
        self.root, self.total, self.base, self.run_id, self.sweep_name = root, total, base, run_id, sweep_name
        self.rows: list[dict] = []
        self.overheads: list[float] = []
        self._written: set[str] = set()
        self._started: dict[str, float] = {}

    def started(self, key: str) -> None:
        self._started[key] = time.perf_counter()

    def result(self, key: str, result: dict) -> None:
        if "row_json" not in result:
            if result.get("error"):
                log.warning("[%d/%s] a trial could not be composed, so it has no row: %s", len(self._written), self.total, result["error"])
            return
        row = json.loads(result["row_json"])
        if self.write(row) and not result.get("cached"):
            wall = time.perf_counter() - self._started.get(key, time.perf_counter())
            if row.get("bench_seconds") is not None:
                self.overheads.append(wall - row["bench_seconds"])
        log.info("[%d/%s] %s", len(self._written), self.total if self.total is not None else "?", _describe(row, result.get("cached", False)))

    def errored(self, config: dict, error: str) -> None:
        """A trial Tune gave up on (its worker died more than sweep.max_failures times)."""
        from sweep.bench import failed_row
        from sweep.run_info import provenance_unloaded

        try:
            cfg = compose(_merge(self.base, config["trial"]))
        except SweepError as exc:
            log.warning("a trial errored and could not be composed (%s): %s", exc, error)
            return
        failure = RuntimeError(f"the trial's worker failed more than sweep.max_failures times; last error: {error}")
        row = {**provenance_unloaded(cfg, self.run_id), **failed_row(cfg, cfg.prompts.n or 0, failure), "sweep_name": self.sweep_name}
        self.write(row)
        log.warning("[%d/%s] trial gave up after retries: %s", len(self._written), self.total, error)

    def write(self, row: dict) -> bool:
        """Write a row once per trial id in this sweep; True if written now."""
        from datetime import datetime

        from sweep.store import write_table

        if row["trial_id"] in self._written:
            return False
        if isinstance(row.get("created_at"), str):
            row["created_at"] = datetime.fromisoformat(row["created_at"])
        write_table("trials", {k: [v] for k, v in row.items()}, root=self.root, provenance={}, stem=row["trial_id"])
        self._written.add(row["trial_id"])
        self.rows.append(row)
        return True


class Progress(tune.Callback):
    """Tune callback on the driver: hands trial events to the row writer."""

    def __init__(self, writer: RowWriter) -> None:
        self.writer = writer

    def on_trial_start(self, iteration, trials, trial, **info):
        self.writer.started(trial.trial_id)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.writer.result(trial.trial_id, result)

    def on_trial_recover(self, iteration, trials, trial, **info):
        log.warning("trial %s lost its worker; retrying it (failures so far: %s)", trial.trial_id, trial.run_metadata.num_failures)

    def on_trial_error(self, iteration, trials, trial, **info):
        self.writer.errored(trial.config, _last_error(trial.error_file))


def _last_error(path: str | None) -> str:
    """The last line of a Tune trial's error file (the exception), or a placeholder."""
    try:
        lines = [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]
        return lines[-1][:300] if lines else "unknown error"
    except (OSError, TypeError):
        return "the worker died"


def _describe(row: dict, cached: bool) -> str:
    from sweep.config import GATE_COLUMNS

    params = " ".join(f"{k}={row[k]}" for k in GATE_COLUMNS if row.get(k) is not None)
    head = f"{row['model']} gate={row['gate']} {params} min_layer={row['min_layer']}".replace("  ", " ")
    if row["status"] == "failed":
        return f"{head}: failed ({row.get('error')})"
    tail = " (row from an earlier run)" if cached else f" ({row.get('trial_seconds', 0):.1f} s, pid {row.get('worker_pid')}, model loads {row.get('worker_model_loads')})"
    return f"{head}: {row['status']} agreement {row['agreement']:.3f} speedup_wall {row['speedup_wall']:.3f}x" + tail


def overhead_summary(outcome: SweepOutcome) -> str:
    if not outcome.overhead_s:
        return ""
    return f"orchestration overhead per trial (driver-observed wall - bench time): median {statistics.median(outcome.overhead_s):.2f} s over {len(outcome.overhead_s)} trials"


# ---------------------------------------------------------------- Ray Jobs (jobs/submit.py)

JOB_EXCLUDES = ["results", "**/__pycache__", "*.egg-info", ".pytest_cache", "outputs", "multirun"]


def submit_job(dashboard: str, overrides: list[str], working_dir: Path, *, auth: str = "token", python: str = "python") -> str:
    """Submit `sweep run OVERRIDES cluster=existing cluster.auth=AUTH` to the cluster's job
    server, shipping ``working_dir`` (the project, without venvs, results or git data, which
    Ray leaves out by default or by JOB_EXCLUDES); returns the submission id."""
    import shlex

    from ray.job_submission import JobSubmissionClient

    args = [*overrides, "cluster=existing", f"cluster.auth={auth}"]
    entrypoint = " ".join([python, "-m", "sweep.cli", "run", *map(shlex.quote, args)])
    try:
        client = JobSubmissionClient(dashboard)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(f"--address {dashboard}: no Ray job server answers there ({str(exc).splitlines()[0]})") from None
    runtime_env: dict[str, Any] = {"working_dir": str(working_dir), "excludes": JOB_EXCLUDES}
    if os.environ.get("SWEEP_DEBUG"):
        runtime_env["env_vars"] = {"SWEEP_DEBUG": os.environ["SWEEP_DEBUG"]}
    deadline = time.monotonic() + 60
    while True:
        try:
            return client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env)
        except RuntimeError as exc:  # a cluster that just started has no job agent yet
            if "No available agent" not in str(exc) or time.monotonic() > deadline:
                raise SweepError(f"--address {dashboard}: the job server refused the job ({str(exc).splitlines()[0]})") from None
            log.info("the cluster's job agent is not up yet; retrying")
            time.sleep(2)


def follow_job(dashboard: str, submission_id: str, out) -> str:
    """Stream the job's logs to ``out`` until it ends; returns its final status."""
    import asyncio

    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(dashboard)

    async def tail() -> None:
        async for lines in client.tail_job_logs(submission_id):
            out.write(lines)
            out.flush()

    try:
        asyncio.run(tail())
    except KeyboardInterrupt:
        raise SweepError(f"stopped following; job {submission_id} keeps running (`ray job stop {submission_id}` stops it)") from None
    except (ConnectionError, OSError, RuntimeError) as exc:
        raise SweepError(f"lost the job server while following {submission_id} ({str(exc).splitlines()[0]}); the job may still be running") from None
    while (status := client.get_job_status(submission_id)) not in {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}:
        time.sleep(1)
    return str(status.value if hasattr(status, "value") else status)
