"""lm-evaluation-harness (``lm-eval``, tested with 0.4.13: the ``harness`` extra pins it): the project's gated
decoding registered as the harness model ``sweep``, so any harness task runs under any gate.

- ``generate_until``: greedy decoding through the engine, with the gate, until one of the request's stop strings
  (or the end-of-sequence token) or its ``max_gen_toks``;
- ``loglikelihood``: the continuation teacher-forced, each position's logits taken where the gate exits (its readout
  of h_l: the logit lens, or a tuned lens), with ``kv_policy=full`` (every layer runs on for the cache, so each
  position's state is the full model's and only the readout is early); ``is_greedy`` asks the same logits.
  Self-speculation is lossless: its loglikelihoods are the full model's;
- ``loglikelihood_rolling`` (perplexity tasks): the same over the whole text after the end-of-text token.

From the command line (the model registers when this module is imported, which ``sweep-lm-eval`` does before it
hands its arguments to lm-eval's own command line)::

    sweep-lm-eval --model sweep --model_args model=smollm2-135m,gate=saturation,eps=0.2 --tasks gsm8k

``model_args``: ``model`` and ``gate`` (config group choices), a gate key by its name (``eps=0.2``,
``min_layer=8``), ``dtype`` and ``seed``, or any config key by its dotted path (``bench.kv_policy=full``,
``model.path=...``). lm-eval's ``--device`` is not used: the config's ``device`` (auto) decides. In a trial,
``eval.task=harness eval.harness_tasks=[...]`` runs the same tasks through the same class, gated and at full depth.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any, NamedTuple

import torch

from sweep.errors import ConfigError, InputError

log = logging.getLogger("sweep.tasks.harness")

LM_EVAL_VERSION = "0.4.13"  # the version the adapter is tested with (pyproject's `harness` extra)


def _lm_eval():
    try:
        import lm_eval  # noqa: F401
        from lm_eval.api.model import LM
        from lm_eval.api.registry import register_model
    except ImportError as exc:
        raise ConfigError(
            f"eval.task=harness: lm-evaluation-harness is not installed; install it with "
            f"`pip install lm-eval=={LM_EVAL_VERSION}` (or the project's `harness` extra)"
        ) from exc
    return LM, register_model


def _overrides(model: str, gate: str, args: dict[str, Any]) -> list[str]:
    """Hydra overrides from lm-eval's model_args: a dotted key as it is, a bare one a gate parameter."""
    import dataclasses

    from sweep.config import GateConfig

    gate_keys = sorted(f.name for f in dataclasses.fields(GateConfig) if f.name != "name")
    out = [f"model={model}", f"gate={gate}"]
    for key, value in args.items():
        if "." in key or key in ("dtype", "seed"):
            out.append(f"{key}={value}")
        elif key in gate_keys:
            out.append(f"gate.{key}={value}")
        else:
            raise ConfigError(
                f"--model_args {key}={value}: not a gate key ({', '.join(gate_keys)}), dtype or seed, nor a dotted "
                "config key (bench.kv_policy=full, model.path=...)"
            )
    return out


class Decoders:
    """What a harness model decodes with: ``generate`` (the trial's decoder: early exit under the gate, or
    self-speculation), ``score`` (teacher-forced logits: the gate with kv_policy=full, or full depth)."""

    def __init__(self, lm, generate, score) -> None:
        self.lm, self.generate, self.score = lm, generate, score

    @classmethod
    def of(cls, lm, gate, mode: str, engine=None) -> "Decoders":
        from sweep.decode.engine import Engine

        exits = gate is not None and bool(gate.probe_layers()) and mode == "early_exit"
        score = Engine(lm, gate, "full") if exits else Engine(lm)
        return cls(lm, engine if engine is not None else (Engine(lm, gate) if exits else Engine(lm)), score)


def model_class():
    """The harness model class (registered as ``sweep`` on first use)."""
    global _CLASS
    if _CLASS is None:
        _CLASS = _define()
    return _CLASS


_CLASS = None


def _define():
    LM, register_model = _lm_eval()

    @register_model("sweep")
    class SweepLM(LM):
        """lm-eval's view of a model decoding under a gate (``sweep.tasks.harness``)."""

        def __init__(
            self,
            model: str = "smollm2-135m",
            gate: str = "full",
            batch_size=None,
            max_batch_size=None,
            device=None,
            decoders: Decoders | None = None,
            max_tokens: int = 256,
            **args,
        ) -> None:
            super().__init__()
            if decoders is None:
                decoders, max_tokens = _load(model, gate, device, args)
            self.decoders, self.max_tokens = decoders, max_tokens
            self.tokenizer = decoders.lm.tokenizer
            self.eot = getattr(self.tokenizer, "eos_token_id", None)

        def _encode(self, text: str) -> list[int]:
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

        def _split(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
            """Context and continuation ids: the pair encoded whole and split where the context's encoding ends
            (trailing spaces of the context move to the continuation, so both tokenize as the text does)."""
            spaces = len(context) - len(context.rstrip(" "))
            if spaces:
                context, continuation = context[:-spaces], context[-spaces:] + continuation
            if context == "":
                if self.eot is None:
                    raise InputError("harness: an empty context needs the tokenizer's end-of-text token")
                return [self.eot], self._encode(continuation)
            whole, ctx = self._encode(context + continuation), self._encode(context)
            return ctx, whole[len(ctx) :]

        def _logprob(self, ctx: list[int], cont: list[int]) -> tuple[float, bool]:
            if not cont:
                return 0.0, True
            forced = torch.tensor(cont)

            def pick(logits, index):
                return forced[index].view(1, 1).to(logits.device)

            out = self.decoders.score.generate(ctx, len(cont), record=True, pick=pick)
            logp = torch.log_softmax(out.logits.double(), dim=-1)
            total = float(logp[torch.arange(len(cont)), forced].sum())
            greedy = bool((out.logits.argmax(-1) == forced).all())
            return total, greedy

        def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
            return [self._logprob(*self._split(*req.args)) for req in requests]

        def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
            out = []
            for req in requests:
                if self.eot is None:
                    raise InputError("harness: loglikelihood_rolling needs the tokenizer's end-of-text token")
                out.append(self._logprob([self.eot], self._encode(req.args[0]))[0])
            return out

        def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
            from sweep.tasks.completions import cut, stop_at

            texts = []
            for req in requests:
                context, kwargs = req.args
                kwargs = dict(kwargs or {})
                until = kwargs.get("until") or []
                until = (until,) if isinstance(until, str) else tuple(until)
                if kwargs.get("do_sample") or (kwargs.get("temperature") or 0) > 0:
                    log.warning("harness: sampling was asked; this model decodes greedily (the gate's tokens)")
                n = int(kwargs.get("max_gen_toks") or self.max_tokens)
                ids = self._encode(context) or ([self.eot] if self.eot is not None else [])
                got = self.decoders.generate.generate(ids, n, stop=stop_at(self.tokenizer, until, self.eot))
                tokens = list(got.tokens)
                if self.eot is not None and self.eot in tokens:
                    tokens = tokens[: tokens.index(self.eot)]
                texts.append(cut(self.tokenizer.decode(tokens, skip_special_tokens=True), until))
            return texts

        @property
        def tokenizer_name(self) -> str:
            return getattr(self.tokenizer, "name_or_path", "sweep").replace("/", "__")

    return SweepLM


def _load(model: str, gate: str, device, args: dict[str, Any]) -> tuple[Decoders, int]:
    """The decoders ``model_args`` ask for, loaded the way `sweep bench` loads them."""
    from sweep.config import compose
    from sweep.decode.speculative import SelfSpeculative, drafter_for
    from sweep.gates import make_gate
    from sweep.models import load_model

    overrides = _overrides(model, gate, args)
    cfg = compose(overrides)
    if device is not None:  # lm-eval's --device (cuda by default): the config's device decides, as for every command
        log.info("harness: lm-eval's device %s is not used; the model runs on device=%s", device, cfg.device)
    lm = load_model(cfg.model, dtype=cfg.dtype, device=cfg.device, seed=cfg.seed)
    g = make_gate(cfg.gate, lm, None)
    engine = None
    if cfg.bench.mode == "self_speculative":
        engine = SelfSpeculative(lm, drafter_for(lm, g), cfg.bench.draft_len, cfg.bench.draft_stop)
    return Decoders.of(lm, g, cfg.bench.mode, engine), cfg.eval.max_tokens


class TaskSet(NamedTuple):
    """Harness tasks as loaded: ``digest`` (``tasks_digest``) and each task's count of evaluation documents."""

    digest: str
    documents: tuple[tuple[str, int], ...]


@functools.lru_cache(maxsize=16)
def check_tasks(tasks: tuple[str, ...], include: str | None) -> TaskSet:
    """Before any work: ``tasks`` load as lm-evaluation-harness loads them for ``run_tasks`` (the task YAMLs under
    ``include`` and the harness's own, each task's dataset and its data files), or one line (rc 2) naming the tasks
    and what failed: a missing data file is refused here, not after the timed rounds. Once per process for a set
    of tasks (a sweep's worker checks them for its first trial). Returns a digest of what was loaded (each task's
    config and documents: ``tasks_digest``), what a stored full-depth side of them is keyed by, and each task's
    count of evaluation documents."""
    _lm_eval()
    from lm_eval.tasks import TaskManager

    try:
        loaded = TaskManager(include_path=include).load(list(tasks))
    except Exception as exc:  # noqa: BLE001 - whatever stops a task loading now would stop it after the work
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        raise InputError(
            f"eval.harness_tasks={list(tasks)}: cannot load them ({type(exc).__name__}: {first})"
            + (f"; tasks are looked up in eval.harness_include={include} and the harness's own" if include else "")
        ) from None
    missing = [t for t in tasks if t not in loaded.get("tasks", {}) and t not in loaded.get("groups", {})]
    if missing:
        raise InputError(f"eval.harness_tasks={list(tasks)}: no task named {missing[0]!r} loaded")
    found = loaded.get("tasks", {})
    documents = tuple((name, len(getattr(found[name], "eval_docs", None) or [])) for name in sorted(found))
    return TaskSet(tasks_digest(found), documents)


def tasks_digest(found: dict) -> str:
    """A digest of loaded harness tasks: each one's name, config (its functions by their qualified names, never an
    address) and evaluation documents, in name order: what its full-depth side depends on, whatever else lies
    beside its files."""
    import hashlib
    import json

    def named(o) -> str:
        qualified = getattr(o, "__qualname__", None)
        return f"{getattr(o, '__module__', '')}.{qualified}" if qualified else type(o).__name__

    h = hashlib.sha256()
    for name in sorted(found):
        task = found[name]
        config = getattr(task, "config", None)
        as_dict = config.to_dict() if callable(getattr(config, "to_dict", None)) else {}
        h.update(json.dumps([name, as_dict], sort_keys=True, default=named).encode())
        for doc in getattr(task, "eval_docs", None) or []:
            h.update(json.dumps(doc, sort_keys=True, default=named).encode())
    return h.hexdigest()[:16]


def run_tasks(cfg, lm, engine, label: str):
    """``eval.harness_tasks`` through the harness model on ``engine`` (the trial's decoder; plain full depth when it
    is an ``Engine`` without a gate): per document the task's first metric, in task then document order."""
    from sweep import progress
    from sweep.tasks.completions import Side

    cls = model_class()
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    gate = getattr(engine, "gate", None)
    decoders = Decoders.of(lm, gate, cfg.bench.mode, engine)
    model = cls(decoders=decoders, max_tokens=cfg.eval.max_tokens)
    manager = TaskManager(include_path=cfg.eval.harness_include)
    with progress.phase(f"harness {label}", None, part="eval"):
        try:
            results = simple_evaluate(
                model=model,
                tasks=list(cfg.eval.harness_tasks),
                task_manager=manager,
                limit=cfg.eval.problems,
                log_samples=True,
                bootstrap_iters=0,
                random_seed=cfg.seed,
                numpy_random_seed=cfg.seed,
                torch_random_seed=cfg.seed,
                fewshot_random_seed=cfg.seed,
            )
        except (KeyError, ValueError) as exc:
            raise ConfigError(f"eval.harness_tasks={cfg.eval.harness_tasks}: {str(exc).splitlines()[0]}") from exc
    scores, metrics = [], []
    for task in sorted(results["samples"]):
        examples = sorted(results["samples"][task], key=lambda e: e["doc_id"])
        metric = examples[0]["metrics"][0] if examples else "acc"
        metrics.append(metric)
        scores.extend(float(e[metric]) for e in examples)
    if any(math.isnan(s) for s in scores):
        raise InputError(f"eval.harness_tasks={cfg.eval.harness_tasks}: a document's metric is not a number")
    return Side(scores, [], [], [], {}, "/".join(dict.fromkeys(metrics)), None)


def main() -> None:
    """``sweep-lm-eval``: lm-eval's own command line, with the ``sweep`` model registered."""
    model_class()
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()


if __name__ == "__main__":
    main()
