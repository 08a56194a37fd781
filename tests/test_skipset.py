"""Skip-set self-speculation: the grammar, the bypass against a hand-built model, lossless decoding on
every family that crops its cache, the screen's first draft against the closed loop's, the search's
reproducibility, and a real skipset sweep whose study joins its rows."""

from __future__ import annotations

import contextlib
import copy

import optuna
import pytest
import torch

from conftest import ALL_TINY, compose, family_params, load, run_cli, sweep
from helpers.contract import chat_prompts
from sweep.decode.engine import Engine
from sweep.errors import ConfigError
from sweep.config.families import TINY
from sweep.models._fidelity import rel_err
from sweep.decode.skipscreen import first_drafts, predict, record
from sweep.gates.skipset import SkipSet, canonical
from sweep.decode.speculative import SelfSpeculative, SkipDraft

N = 12
ATTENTION = [f for f in ALL_TINY if TINY[f].kind in ("dense", "moe")] + ["falcon-h1"]  # its attention beside a mixer
SETS = ["none", "a1", "m2", "a2+m3", "a1-4", "m1-4", "a1+m1+a3-4"]


def test_the_grammar_has_one_canonical_text():
    assert canonical("a5-9,m3,a3") == canonical("m3+a3+a5+a6+a7+a8+a9") == "a3+m3+a5-9"
    assert canonical("") == canonical("none") == "none"
    s = SkipSet.parse("a1-2+m2")
    assert s.ratio(4) == 3 / 8 and s.ratio(4, 6) == 3 / 6 and len(s) == 3
    for bad in ("x3", "a0", "a3-2", "a", "a1;m2", "m-1"):
        with pytest.raises(ValueError):
            SkipSet.parse(bad)


@pytest.mark.slow  # a program's start and its imports: 5 s or more of the fast tier (benchmarks/RESULTS.md)
def test_a_bad_skip_set_is_one_line_before_any_work(tmp_path):
    out = run_cli(
        "bench",
        "model=tiny-llama",
        "gate=skip",
        "gate.skip=a1+q2",
        "bench.mode=self_speculative",
        f"results.root={tmp_path}",
    )
    assert (
        out.returncode == 2 and out.stderr.count("error:") == 1 and "gate.skip=a1+q2: must be a skip set" in out.stderr
    )
    out = run_cli("bench", "model=tiny-llama", "gate=skip", "gate.skip=a9", "bench.mode=self_speculative")
    assert out.returncode == 2 and "gate.skip=a9: names layer 9; layers are 1..4" in out.stderr
    with pytest.raises(ConfigError, match="gate=skip: drafts for bench.mode=self_speculative"):
        compose("gate=skip", "gate.skip=a1")


def test_a_layer_number_past_any_model_is_refused_saying_what_is_wrong():
    """Before: a range was expanded whole (a reader's `gate.skip=a1-99999999999` took 24 GB until the kernel killed
    it), and a text the parser refused for a reason got the grammar alone."""
    with pytest.raises(ValueError, match="'a1-20000': names layer 20000; a layer number is at most 10000"):
        SkipSet.parse("a1-20000")
    for text, why in (("a1-20000", "names layer 20000; a layer number is at most 10000"), ("a3-2", "runs upwards")):
        with pytest.raises(ConfigError) as exc:
            compose("gate=skip", f"gate.skip={text}", "bench.mode=self_speculative")
        said = str(exc.value)
        assert said.startswith(f"gate.skip={text}: must be a skip set: ") and said.endswith(f"{why})"), said


@pytest.mark.ray
def test_a_grid_of_relative_skip_set_files_runs_where_its_workers_run(tmp_path):
    """`file:one.json` relative to where `sweep run` ran. Before: the driver read it and merged it with the same set
    spelled otherwise, and the worker, composing the raw override in its own directory, failed ("no such file")."""
    import json

    from sweep.store import read

    (tmp_path / "one.json").write_text(json.dumps({"attention": [1], "mlp": [1]}))
    space = "search.spaces=[{gate: skip, bench.mode: self_speculative, gate.skip: 'choice(file:one.json, a1)'}]"
    args = ["model=tiny-llama", "prompts.n=1", "bench.gen_tokens=4", "bench.repeats=1", "bench.warmup=0"]
    done = run_cli("run", *args, space, "results.root=results", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read("trials", tmp_path / "results")
    assert sorted(rows["skip"].to_list()) == ["a1", "a2+m2"] and set(rows["status"]) == {"ok"}


@pytest.mark.ray
def test_an_optuna_search_over_relative_skip_set_files_runs_where_its_workers_run(tmp_path):
    """As a grid's: Optuna's drawn `file:two.json` is read where `sweep run` ran. Before: each worker composed the
    raw path in its own directory ("a setting could not be composed ... no such file") and the set had no row."""
    import json

    from sweep.store import read

    (tmp_path / "one.json").write_text(json.dumps({"attention": [1], "mlp": []}))
    (tmp_path / "two.json").write_text(json.dumps({"attention": [], "mlp": [1]}))
    sets = "gate.skip: 'choice(file:one.json, file:two.json)'"
    space = f"search.spaces=[{{gate: skip, bench.mode: self_speculative, {sets}}}]"
    args = ["model=tiny-llama", "prompts.n=1", "bench.gen_tokens=4", "bench.repeats=1", "bench.warmup=0"]
    args += ["search=optuna-constrained", "search.n_trials=2", space, "results.root=r"]
    done = run_cli("run", *args, cwd=tmp_path)
    assert done.returncode == 0 and "could not be composed" not in done.stderr, done.stderr[-3000:]
    rows = read("trials", tmp_path / "r")
    assert set(rows["skip"].to_list()) == {"a2", "m2"} and set(rows["status"]) == {"ok"}


def hand_built(lm, skip: SkipSet):
    """A copy of the model with the skipped sublayers' output projections zeroed: they add nothing."""
    model = copy.deepcopy(lm.model)
    layers = model.get_decoder().layers
    with torch.no_grad():
        for layer in skip.attention:
            layers[layer - 1].self_attn.o_proj.weight.zero_()
        for layer in skip.mlp:
            layers[layer - 1].mlp.down_proj.weight.zero_()
    return model


@pytest.mark.parametrize("text", ["a1", "m2", "a1+m1+a3-4", "a2-3+m4"])
def test_the_bypass_equals_a_model_with_those_sublayers_removed(text):
    """Decoding step by step from an empty cache (a bypassed first attention layer leaves its cache empty)
    and one forward over the whole sequence both give the hand-built model's logits."""
    lm = load("model=tiny-llama")
    skip = SkipSet.parse(text)
    ids = list(range(3, 20))
    with torch.inference_mode():
        expected = hand_built(lm, skip)(input_ids=torch.tensor([ids])).logits[0]
        with lm.adapter.bypassing(skip):
            whole = lm.model(input_ids=torch.tensor([ids])).logits[0]
            cache, stepped = lm.adapter.new_cache(), []
            for pos, token in enumerate(ids):
                position = torch.tensor([[pos]])
                stepped.append(lm.adapter.forward(torch.tensor([[token]]), cache, position_ids=position)[0, -1])
    # to rounding (a cached step and a whole-sequence forward sum in different orders: 1e-5 of the logits' scale)
    assert rel_err(whole, expected) <= 1e-5 and rel_err(torch.stack(stepped), expected) <= 1e-5
    assert not any("forward" in m.__dict__ for m in lm.model.modules())  # the model comes out as it went in


def _sets(lm) -> list[str]:
    """SETS where each layer has an attention and an MLP; else sets of the model's own skippable sublayers (a
    hybrid's or a state-space model's mixers among them), and its attention-free draft where it has attention."""
    names = lm.adapter.skippable()
    if all(f"{k}{layer}" in names for layer in range(1, lm.num_layers + 1) for k in "am"):
        return SETS
    free = ["attention-free"] if lm.adapter.attention_sublayers() else []
    return ["none", names[0], names[1], "+".join(names[::2]), "+".join(names), *free]


@pytest.mark.parametrize("family", family_params(ALL_TINY))
def test_skip_set_drafts_are_lossless_and_the_screen_predicts_each_rounds_first_draft(family):
    """On every family (the representative ones in the fast tier, the rest under ``families``; sliding windows and
    state-space layers rolled back): output equals full depth for every set and draft length, the empty set's drafts
    are all accepted, and the screen's first draft of every round the closed loop ran is accepted exactly when the
    closed loop's was (a model with state-space layers screened from its rolled-back cache, one position at a
    time)."""
    lm = load(f"model=tiny-{family}")
    prompts = [p.input_ids for p in chat_prompts(lm, 2)]
    rec = record(lm, prompts, N)
    assert (rec.caches is not None) == (lm.adapter.kind != "attention")
    for text in _sets(lm):
        skip = SkipSet.parse(text).resolve(lm.adapter.attention_sublayers())
        screen = first_drafts(lm, rec, skip)
        for draft_len in (1, 3):
            for i, ids in enumerate(prompts):
                gen = SelfSpeculative(lm, SkipDraft(lm, skip), draft_len).generate(ids, N)
                assert gen.tokens == rec.tokens[i] == Engine(lm).generate(ids, N).tokens, (text, draft_len)
                for start, drafted, accepted in zip(gen.round_starts, gen.drafted_lengths, gen.accepted_lengths):
                    assert drafted >= 1
                    assert bool(screen.match[i][start - 1]) == (accepted >= 1), (text, draft_len, start)
                if text == "none":
                    assert gen.acceptance_rate == 1.0
        if text == "none":
            assert all(bool(m.all()) for m in screen.match)
            assert predict(screen, 3).acceptance_rate == 1.0


def test_draft_stop_ends_drafting_at_an_unsure_draft():
    lm = load("model=tiny-llama")
    ids = chat_prompts(lm, 1)[0].input_ids
    baseline = Engine(lm).generate(ids, N).tokens
    never = SelfSpeculative(lm, SkipDraft(lm, SkipSet.parse("a1")), 4, draft_stop=1.0).generate(ids, N)
    assert never.tokens == baseline and never.drafted == 0 and never.rounds == N - 1  # a full step a round
    always = SelfSpeculative(lm, SkipDraft(lm, SkipSet.parse("a1")), 4, draft_stop=0.0).generate(ids, N)
    unstopped = SelfSpeculative(lm, SkipDraft(lm, SkipSet.parse("a1")), 4).generate(ids, N)
    assert always.drafted_lengths == unstopped.drafted_lengths and always.tokens == baseline


class CountingDraft:
    """A skip-set draft that counts its forward passes."""

    def __init__(self, lm, skip: str) -> None:
        self.inner, self.passes = SkipDraft(lm, SkipSet.parse(skip)), 0

    @contextlib.contextmanager
    def session(self):
        with self.inner.session() as draft:

            def counted(token, cache, position):
                self.passes += 1
                return draft(token, cache, position)

            yield counted


@pytest.mark.parametrize("stop", [None, 0.05, 0.1, 1.0])
def test_a_round_counts_every_draft_pass_a_dropped_draft_included(stop):
    lm = load("model=tiny-llama")
    ids = chat_prompts(lm, 1)[0].input_ids
    drafter = CountingDraft(lm, "a1+m2")
    gen = SelfSpeculative(lm, drafter, 3, draft_stop=stop).generate(ids, N)
    assert sum(gen.draft_steps) == drafter.passes and len(gen.draft_steps) == gen.rounds
    dropped = [s - k for s, k in zip(gen.draft_steps, gen.drafted_lengths)]
    assert set(dropped) <= {0, 1}
    if stop is None:
        assert sum(dropped) == 0
    if stop == 1.0:  # every draft is below 1: each round computes one and keeps none
        assert gen.draft_steps == [1] * (N - 1) and gen.drafted == 0
    if stop in (0.05, 0.1):  # the tiny model's drafts straddle these (its top-1 probabilities are 0.04-0.2)
        assert sum(dropped) > 0 and gen.drafted > 0, (gen.draft_steps, gen.drafted_lengths)


def test_the_search_with_one_seed_gives_the_same_study_twice():
    from sweep.bench.costs import cost_model
    from sweep.orchestrate.searches.skipstudy import best_trials, candidate, search

    lm = load("model=tiny-llama")
    rec = record(lm, [p.input_ids for p in chat_prompts(lm, 2)], N)
    costs = cost_model(lm, rec.prompt_ids[0], kv_policies=[], verify_positions=5)
    studies = []
    for sampler in ("tpe", "tpe", "random"):
        study = search(
            lambda skip: first_drafts(lm, rec, skip),
            num_layers=4,
            n_trials=25,
            sampler=sampler,
            seed=3,
            ratio=(0.1, 0.6),
            draft_len=4,
            draft_stop=None,
            costs=costs,
        )
        studies.append([(t.params, t.value, t.user_attrs["skip"]) for t in study.trials])
        chosen = [candidate(t) for t in best_trials(study, 3)]
        assert all(0.1 <= SkipSet.parse(c.skip).ratio(4) <= 0.6 and c.draft_stop is None for c in chosen)
        assert len(set(chosen)) == len(chosen)
    assert studies[0] == studies[1] and studies[0] != studies[2]


def test_draft_stops_and_lens_are_searched_with_the_set_and_each_candidate_is_priced_at_its_own():
    """search.draft_stops and search.draft_lens: each candidate draws a draft_stop and a draft_len; its screen
    figures are the screen's prediction at those (recomputed here per trial), and every value is among the
    candidates chosen."""
    from sweep.orchestrate.searches.skipstudy import best_trials, candidate

    lm, rec, costs, study = _tiny_study(
        2, n_trials=40, seed=5, draft_stop=0.5, draft_stops=[None, 1.0], draft_lens=[1, 4]
    )  # (draft_stop unused: draft_stops is given)
    assert {(t.params["draft_stop"], t.params["draft_len"]) for t in study.trials} == {
        (None, 1),
        (None, 4),
        (1.0, 1),
        (1.0, 4),
    }
    lengths = {}
    for t in study.trials:
        skip, stop, n = SkipSet.parse(t.user_attrs["skip"]), t.params["draft_stop"], t.params["draft_len"]
        assert (t.user_attrs["draft_stop"], t.user_attrs["draft_len"]) == (stop, n)
        alone = predict(first_drafts(lm, rec, skip), n, stop, costs, skip)
        assert t.value == pytest.approx(alone.speedup, rel=1e-12)
        if stop == 1.0:  # every draft is dropped: one pass and no kept draft per round
            assert t.user_attrs["acceptance_length"] == 1.0
        lengths.setdefault((t.user_attrs["skip"], stop), {})[n] = t.user_attrs["acceptance_length"]
    # a round of one draft accepts at most one: its length never exceeds 2, and never exceeds four drafts' length
    assert all(by[1] <= 2.0 for by in lengths.values() if 1 in by)
    assert all(by[1] <= by[4] + 1e-12 for by in lengths.values() if len(by) == 2)
    chosen = [candidate(t) for t in best_trials(study, 40)]
    assert {(c.draft_stop, c.draft_len) for c in chosen} == {(None, 1), (None, 4), (1.0, 1), (1.0, 4)}
    assert len(set(chosen)) == len(chosen)
    best = max(study.trials, key=lambda t: t.value)
    assert chosen[0] == (best.user_attrs["skip"], best.params["draft_stop"], best.params["draft_len"])


def test_a_resumed_study_draws_what_it_drew_or_the_search_stops_in_one_line(tmp_path):
    """A study resumed with other draft_stops (or none where it drew them) is refused, naming the key; a study
    screened before draft_stop and draft_len were recorded gives its trials the search's own."""
    import optuna

    from sweep.bench.costs import cost_model
    from sweep.orchestrate.searches.skipstudy import best_trials, candidate, search

    lm = load("model=tiny-llama")
    rec = record(lm, [p.input_ids for p in chat_prompts(lm, 1)], N)
    costs = cost_model(lm, rec.prompt_ids[0], kv_policies=[], verify_positions=5)
    storage = f"sqlite:///{tmp_path}/optuna.db"

    def run(n, **drawn):
        kw = dict(num_layers=4, sampler="random", seed=1, ratio=(0.0, 1.0), draft_len=4, draft_stop=None)
        screen = lambda skip: first_drafts(lm, rec, skip)  # noqa: E731
        return search(screen, n_trials=n, costs=costs, storage=storage, study_name="s", **kw, **drawn)

    run(3, draft_stops=[None, 1.0])
    assert len(run(5, draft_stops=[None, 1.0]).trials) == 5  # the same list resumes
    with pytest.raises(ConfigError, match=r"^search.draft_stops=\[null,0.5\]: the study this sweep resumes drew "):
        run(6, draft_stops=[None, 0.5])
    with pytest.raises(ConfigError, match=r"^search.draft_stops=null: the study this sweep resumes drew draft_stop"):
        run(6)
    with pytest.raises(ConfigError, match=r"^search.draft_lens=\[2\]: the study this sweep resumes did not draw "):
        run(6, draft_stops=[None, 1.0], draft_lens=[2])
    # a trial of an older study: no draft_stop or draft_len recorded; it ran at the search's own
    old = optuna.create_study(direction="maximize")
    dist = optuna.distributions.CategoricalDistribution([False, True])
    old.add_trial(
        optuna.trial.create_trial(
            params={"a1": True}, distributions={"a1": dist}, value=0.5, user_attrs={"skip": "a1", "ratio_violation": 0}
        )
    )
    assert [candidate(t, 0.3, 3) for t in best_trials(old, 2, 0.3, 3)] == [("a1", 0.3, 3)]


def test_a_skipset_sweep_screens_then_measures_the_best_and_its_study_joins_the_rows(tmp_path, ray_session, caplog):
    import logging

    import optuna
    import polars as pl

    from sweep import progress
    from sweep.store import scan

    events: list[progress.Event] = []
    caplog.set_level(logging.INFO, logger="sweep")
    args = (
        "search=skipset-optuna",
        "search.n_trials=12",
        "search.closed_loop=2",
        "search.skip_ratio=[0.1,0.5]",
        "search.draft_stops=[null,0.1]",  # draft_stop and draft_len searched with the set
        "search.draft_lens=[2,3]",
        "bench.gen_tokens=8",
    )
    with progress.listen(events.append):
        out = sweep(tmp_path, *args)
    # the screen's worker shows each screened set on the driver while the driver waits on it
    screened = [e for e in events if e.source == "skip-set screen" and e.phase == "skip-set screen"]
    assert screened[-1].kind == "end" and screened[-1].done == screened[-1].total == 12
    steps = [e.done for e in screened if e.kind == "step"]  # the worker forwards plain steps at most once a second
    assert steps[0] == 1 and steps[-1] == 12 and steps == sorted(set(steps))
    rows = scan("trials", tmp_path).collect()
    assert rows.height == 2 and rows["status"].to_list() == ["ok", "ok"]
    assert (rows["agreement"] == 1.0).all() and (rows["mode"] == "self_speculative").all()
    assert rows["skip_ratio"].is_between(0.1, 0.5).all() and rows["acceptance_length"].is_not_null().all()
    study = optuna.load_study(study_name="skipset-optuna", storage=f"sqlite:///{out.path}/optuna.db")
    distinct = [t for t in study.trials if "repeat_of" not in t.user_attrs]  # a candidate drawn again is told
    assert len(distinct) == len({t.user_attrs["trial_id"] for t in study.trials}) == 12  # 12 distinct candidates
    joined = {
        t.user_attrs["trial_id"]: (t.user_attrs["skip"], t.params["draft_stop"], t.params["draft_len"])
        for t in study.trials
    }
    for row in rows.iter_rows(named=True):
        assert joined[row["trial_id"]] == (row["skip"], row["draft_stop"], row["draft_len"])  # a screened candidate
    # the driver names each chosen set with what the study drew with it, as overrides, and its screen figures
    by_id = {t.user_attrs["trial_id"]: t for t in study.trials}
    for row in rows.iter_rows(named=True):
        stop = "null" if row["draft_stop"] is None else f"{row['draft_stop']}"
        t = by_id[row["trial_id"]]
        figures = f"predicted {t.value:.3f}x, acceptance length {t.user_attrs['acceptance_length']:.2f}"
        assert f"{row['skip']} (bench.draft_stop={stop}, bench.draft_len={row['draft_len']}): {figures}" in caplog.text
    # and says so when no candidate is predicted to beat full depth
    best = max(t.value for t in study.trials if t.user_attrs["ratio_violation"] == 0)
    assert ("no screened candidate is predicted to beat full depth" in caplog.text) == (best < 1)
    assert rows.filter(pl.col("gate") != "skip").height == 0
    from sweep.report.build import run_analyze

    report, _ = run_analyze(compose(f"results.root={tmp_path}"))
    text = report.read_text()
    shown = [line for line in text.splitlines() if line.startswith("| tiny-llama | skip ") and " drafts" in line]
    assert "## Self-speculation" in text and len(shown) == 1  # the best skip set, by the ranked speedup
    assert any(f"skip {skip} " in shown[0] for skip in rows["skip"].to_list())
    # each row's draft_stop shows in the sweep's table and in the report's best set where it is not null
    from sweep.report.run_report import sweep_report

    stops = rows["draft_stop"].to_list()
    assert ("draft_stop" in sweep_report(out)) == any(s is not None for s in stops)
    pairs = {(r["skip"], r["draft_stop"]) for r in rows.iter_rows(named=True)}
    assert any(
        f"skip {skip} " in shown[0]
        and ((f"stop below {stop:g}" in shown[0]) if stop is not None else "stop" not in shown[0])
        for skip, stop in pairs
    ), (shown[0], pairs)
    assert (report.parent / "skip_sets.png").is_file()
    # run again (no resume, no sweep.name): its sweep continued, the finished study read on the driver, no worker
    # screening, the same sets chosen, nothing measured again
    trials = len(study.trials)
    events.clear()
    with progress.listen(events.append):
        again = sweep(tmp_path, *args)
    assert again.name == out.name and again.written == 0
    assert sorted(r["trial_id"] for r in again.rows) == sorted(rows["trial_id"].to_list())
    assert not [e for e in events if e.source == "skip-set screen"]
    assert (
        len(optuna.load_study(study_name="skipset-optuna", storage=f"sqlite:///{out.path}/optuna.db").trials) == trials
    )


def test_the_cost_models_speculative_prediction_is_its_rounds_priced_by_hand():
    """speedup_model of a self-speculative generation: each round's drafts at the skip set's step cost (a full
    step less its bypassed sublayers) plus a verification of drafts + 1 positions, against full-depth steps."""
    from sweep.bench.costs import cost_model
    from sweep.models.prompts import Prompt
    from sweep.bench.metrics import PromptRun, speculation

    lm = load("model=tiny-llama")
    ids = chat_prompts(lm, 1)[0].input_ids
    skip = SkipSet.parse("a2+m3")
    gen = SelfSpeculative(lm, SkipDraft(lm, skip), 3).generate(ids, N)
    costs = cost_model(lm, ids, kv_policies=[], verify_positions=4)
    step = costs.step_ms - costs.attn_ms - costs.mlp_ms  # one attention and one MLP bypassed
    by_hand = (N - 1) * costs.step_ms / sum(k * step + costs.verify_ms[k] for k in gen.drafted_lengths)

    class Gate:  # what speculation() reads of a skip gate
        name, cfg = "skip", type("Cfg", (), {"skip": "a2+m3"})

    row = speculation([PromptRun(Prompt("p", "", list(ids)), gen, gen)], costs, Gate, 3)
    assert row["speedup_model"] == pytest.approx(by_hand, rel=1e-9)
    # draft_stop=1 drops every draft: each round still pays one draft pass and verifies one position
    stopped = SelfSpeculative(lm, SkipDraft(lm, skip), 3, draft_stop=1.0).generate(ids, N)
    every_round = (N - 1) * costs.step_ms / ((N - 1) * (step + costs.verify_ms[0]))
    row = speculation([PromptRun(Prompt("p", "", list(ids)), stopped, stopped)], costs, Gate, 3)
    assert row["speedup_model"] == pytest.approx(every_round, rel=1e-9) and every_round < 1
    rec = record(lm, [ids], N)
    screened = predict(first_drafts(lm, rec, skip), 3, 1.0, costs, skip)
    assert screened.speedup == pytest.approx(every_round, rel=1e-9) and screened.draft_steps == [1] * (N - 1)
    assert costs.verify_ms[0] > 0 and len(costs.verify_ms) >= 4 and costs.attn_ms >= 0 and costs.mlp_ms >= 0


@pytest.mark.parametrize("family", ["jamba", "falcon-h1"])
def test_a_skipset_sweep_searches_a_hybrids_own_sublayers(tmp_path, ray_session, family):
    """On a hybrid the study searches the sublayers it has (Jamba: a state-space mixer or attention per layer, each
    with an MLP; Falcon-H1: its attention, not the mixer beside it), screens from the rolled-back cache, and the
    chosen sets run closed-loop, lossless."""
    import optuna
    import polars as pl

    from sweep.store import scan

    out = sweep(
        tmp_path,
        f"model=tiny-{family}",
        "search=skipset-optuna",
        "search.n_trials=8",
        "search.closed_loop=2",
        "search.skip_ratio=[0.1,0.6]",
        "bench.gen_tokens=8",
    )
    skippable = load(f"model=tiny-{family}").adapter.skippable()
    study = optuna.load_study(study_name="skipset-optuna", storage=f"sqlite:///{out.path}/optuna.db")
    assert set(study.trials[0].params) == set(skippable)
    assert any(n.startswith("s") for n in skippable) == (family == "jamba")
    for t in study.trials:
        drawn = [name for name in skippable if t.params[name]]
        assert SkipSet.parse(t.user_attrs["skip"]) == SkipSet.parse("+".join(drawn) or "none")
        assert t.user_attrs["skip_ratio"] == pytest.approx(len(drawn) / len(skippable))
    rows = scan("trials", tmp_path).collect().filter(pl.col("gate") == "skip")
    assert rows.height == 2 and rows["status"].to_list() == ["ok", "ok"]
    assert (rows["agreement"] == 1.0).all() and rows["acceptance_length"].is_not_null().all()
    for row in rows.iter_rows(named=True):  # the row's ratio is the study's: of the sublayers the model has
        assert row["skip_ratio"] == pytest.approx(len(SkipSet.parse(row["skip"])) / len(skippable))


def test_an_extended_study_screens_only_candidates_it_has_not(tmp_path):
    """A skip-set study of 4 candidates extended to 8 (the same storage, seed and sampler, as a resumed sweep's
    worker runs it): 8 distinct candidates, the first 4 kept; the resumed sampler does not draw its first 4
    again (a random sampler restarted on its seed would), and a candidate drawn twice is told, not counted."""
    from sweep.bench.costs import cost_model
    from sweep.orchestrate.searches.skipstudy import candidate, search

    lm = load("model=tiny-llama")
    rec = record(lm, [p.input_ids for p in chat_prompts(lm, 2)], N)
    costs = cost_model(lm, rec.prompt_ids[0], kv_policies=[], verify_positions=5)
    storage = f"sqlite:///{tmp_path / 'study.db'}"

    def screened(n_trials: int):
        study = search(
            lambda skip: first_drafts(lm, rec, skip),
            num_layers=4,
            n_trials=n_trials,
            sampler="random",
            seed=3,
            ratio=(0.0, 1.0),
            draft_len=4,
            draft_stop=None,
            costs=costs,
            storage=storage,
        )
        done = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
        return [candidate(t) for t in done if "repeat_of" not in t.user_attrs], done

    first, _ = screened(4)
    extended, trials = screened(8)
    assert len(set(first)) == 4 and extended[:4] == first
    assert len(extended) == len(set(extended)) == 8
    for t in trials:  # a repeat carries the figure of the candidate it repeats
        if "repeat_of" in t.user_attrs:
            assert t.value == next(o.value for o in trials if o.number == t.user_attrs["repeat_of"])


@pytest.mark.parametrize("family", ["llama", "gemma2", "jamba", "falcon-h1", "mamba2"])
def test_the_screen_predicts_position_one_and_the_histogram_of_the_closed_loop(family):
    """At draft_len 1 every round is one draft, so the screen's rounds are the closed loop's: its predicted
    acceptance at position 1 and its accepted-length histogram equal the closed loop's, computed by another path
    (one batched pass over recorded K/V against step-by-step drafting with rollbacks)."""
    from sweep.decode.skipscreen import position_acceptance

    lm = load(f"model=tiny-{family}")
    prompts = [p.input_ids for p in chat_prompts(lm, 2)]
    rec = record(lm, prompts, N)
    names = lm.adapter.skippable()  # a hybrid's mixers among them
    for text in (names[0], names[-1], f"{names[1]}+{names[-1]}"):
        skip = SkipSet.parse(text)
        predicted = predict(first_drafts(lm, rec, skip), 1)
        drafted, accepted = [], []
        for ids in prompts:
            gen = SelfSpeculative(lm, SkipDraft(lm, skip), 1).generate(ids, N)
            drafted += gen.drafted_lengths
            accepted += gen.accepted_lengths
        assert predicted.by_position(1) == position_acceptance(drafted, accepted, 1)[0], text
        assert predicted.histogram(1) == position_acceptance(drafted, accepted, 1)[1], text


def test_a_published_skip_set_round_trips_and_runs(tmp_path):
    """gate.skip=file:PATH reads a set written as Draft&Verify publishes one (0-based attention and MLP indices), by
    name where the file holds several; written back it is the same file, and the draft it names is lossless."""
    import json

    ours = SkipSet.parse("a1+a3+m2")
    assert ours.published() == {"attention": [0, 2], "mlp": [1]}
    path = tmp_path / "skip_layers.json"
    path.write_text(json.dumps({"tiny-llama": ours.published(), "other": {"attention": [1], "mlp": []}}))
    cfg = compose("model=tiny-llama", "gate=skip", f"gate.skip=file:{path}@tiny-llama", "bench.mode=self_speculative")
    assert cfg.gate.skip == "a1+m2+a3"  # the canonical text: the same trial as the set written out
    assert SkipSet.parse(cfg.gate.skip).published() == json.loads(path.read_text())["tiny-llama"]
    lm = load("model=tiny-llama")
    ids = chat_prompts(lm, 1)[0].input_ids
    gen = SelfSpeculative(lm, SkipDraft(lm, SkipSet.parse(cfg.gate.skip)), 3).generate(ids, N)
    assert gen.tokens == Engine(lm).generate(ids, N).tokens


@pytest.mark.parametrize(
    "content, says",
    [
        (None, "no such file"),
        ("{not json", "cannot read a JSON skip set"),
        ('{"a": {"attention": [1]}, "b": {"mlp": [0]}}', "the file holds 2 sets; name one"),
        ('{"attention": [-1]}', "attention must be a list of 0-based layer indices"),
        ('{"layers": [1]}', 'expected {"attention"'),
    ],
)
def test_a_bad_published_skip_set_is_one_line(tmp_path, content, says):
    path = tmp_path / "s.json"
    if content is not None:
        path.write_text(content)
    done = run_cli("bench", "model=tiny-llama", "gate=skip", f"gate.skip=file:{path}", "bench.mode=self_speculative")
    assert done.returncode == 2 and says in done.stderr and f"gate.skip=file:{path}" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_published_sets_path_with_an_unset_variable_is_named_as_such(tmp_path, monkeypatch):
    """As every path a user names: an environment variable that is not set is said, not "no such file"."""
    monkeypatch.delenv("SKIP_SET_DIR_UNSET", raising=False)
    with pytest.raises(ConfigError, match=r"file:\$SKIP_SET_DIR_UNSET/s.json: the environment variable SKIP_SET_DIR"):
        skip = "gate.skip=file:$SKIP_SET_DIR_UNSET/s.json"
        compose("model=tiny-llama", "gate=skip", skip, "bench.mode=self_speculative")


def test_a_published_set_is_named_only_where_the_file_names_sets_and_a_path_may_hold_an_at(tmp_path):
    """A file of one unnamed set given @NAME picked nothing (the name was dropped); a directory holding '@' is a
    path, not a name."""
    import json

    one = tmp_path / "one.json"
    one.write_text(json.dumps({"attention": [1], "mlp": []}))
    with pytest.raises(ConfigError, match="the file holds one set, not a mapping of named sets; drop @nope"):
        compose("model=tiny-llama", "gate=skip", f"gate.skip=file:{one}@nope", "bench.mode=self_speculative")
    (tmp_path / "a@b").mkdir()
    at = tmp_path / "a@b" / "s.json"
    at.write_text(json.dumps({"attention": [1], "mlp": [0]}))
    cfg = compose("model=tiny-llama", "gate=skip", f"gate.skip=file:{at}", "bench.mode=self_speculative")
    assert cfg.gate.skip == SkipSet.parse("a2+m1").text()


def test_a_sublayer_a_layer_lacks_is_one_line_naming_what_it_has():
    lm = load("model=tiny-jamba")  # layers 1 and 3: a state-space mixer and an MLP; 2 and 4: attention and MLP
    with pytest.raises(ConfigError, match=r"layer 2 has no state-space mixer sublayer \(s2\); it has a \(attention\)"):
        SkipDraft(lm, SkipSet.parse("s2"))
    hybrid = load("model=tiny-falcon-h1")  # attention and a mixer side by side in one cache layer
    with pytest.raises(ConfigError, match="runs attention and a state-space mixer side by side"):
        SkipDraft(hybrid, SkipSet.parse("s1"))
    assert SkipSet.parse("attention-free").text() == "attention-free"
    assert SkipSet.parse("s3+a1-2+m2").text() == "a1-2+m2+s3"


def test_the_skip_map_draws_a_hybrids_bypassed_mixers_and_an_attention_free_set(tmp_path):
    """The report's skip-set map has a mixer row where a set bypasses state-space mixers (a hybrid's best set),
    fills the attention row of an attention-free set, and draws the figure from both."""
    from sweep.gates.skipset import SkipSet
    from sweep.report.figures import skip_map_figure, skip_map_rows

    plain = skip_map_rows(SkipSet.parse("a2+m3-4"), 5)
    assert plain == [("attention", [False, True, False, False, False]), ("MLP", [False, False, True, True, False])]
    hybrid = dict(skip_map_rows(SkipSet.parse("s1+s4+m2"), 4))
    assert list(hybrid) == ["attention", "MLP", "mixer"] and hybrid["mixer"] == [True, False, False, True]
    assert hybrid["attention"] == [False] * 4 and hybrid["MLP"] == [False, True, False, False]
    free = skip_map_rows(SkipSet.parse("attention-free"), 3)
    assert free[0] == ("attention (all it has)", [True] * 3) and free[1] == ("MLP", [False] * 3)
    name = skip_map_figure([("hyb", "s1+s4+m2", 4, 0.5), ("dense", "a2+m3-4", 5, None)], tmp_path)
    assert (tmp_path / name).stat().st_size > 0


SCREEN = ("search=skipset-random", "search.closed_loop=1", "prompts.n=1", "bench.gen_tokens=4", "bench.repeats=1")


@pytest.mark.ray
def test_a_space_with_fewer_sets_than_n_trials_is_screened_once(tmp_path):
    """A 2-layer state-space model has 4 skip sets; 5 asked. Before: the log said 5 screened, and every continued
    run screened again, its study drawing another 100 proposals."""
    import optuna

    args = [*SCREEN, "model=tiny-mamba", "model.tiny.layers=2", "search.n_trials=5", "search.skip_ratio=[0,1]"]
    args += [f"results.root={tmp_path}", "sweep.name=s"]
    first = run_cli("run", *args)
    assert first.returncode == 0, first.stderr[-3000:]
    said = " ".join(first.stderr.split())
    assert "skip-set screen: 4 sets screened on tiny-mamba in " in said
    storage = f"sqlite:///{tmp_path / 'ray' / 's' / 'optuna.db'}"
    (summary,) = optuna.get_all_study_summaries(storage)
    proposals = len(optuna.load_study(study_name=summary.study_name, storage=storage).trials)
    again = run_cli("run", *args, "resume=true")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "skip-set screen: 4 sets screened on tiny-mamba before (its study, read again)" in " ".join(
        again.stderr.split()
    )
    assert len(optuna.load_study(study_name=summary.study_name, storage=storage).trials) == proposals


@pytest.mark.ray
def test_a_skip_ratio_no_screened_set_meets_is_one_line(tmp_path):
    """tiny-llama's 8 sublayers give shares in eighths: none in [0.05, 0.1]. Before: "the best 0 run closed-loop:",
    then nothing ran, rc 0."""
    args = [
        *SCREEN,
        "model=tiny-llama",
        "search.n_trials=4",
        "search.skip_ratio=[0.05,0.1]",
        f"results.root={tmp_path}",
    ]
    done = run_cli("run", *args)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode == 2 and errors == [
        "error: search.skip_ratio=[0.05, 0.1]: none of the 4 sets screened on tiny-llama skips a share of its "
        "sublayers in that range, so none runs closed-loop; widen it, or screen more sets (search.n_trials)"
    ], done.stderr[-3000:]


def test_a_bench_whose_draft_stop_keeps_no_draft_ends_with_its_summary(tmp_path):
    """bench.draft_stop=1.0 stops every draft: the row was written, then the summary failed formatting its absent
    acceptance rate (rc 1, "unexpected TypeError"); and its layers-saved line said kv_policy=full saves no layer,
    the early-exit note, where self-speculation verifies every token at full depth."""
    from sweep.bench.command import run_bench

    args = ("model=tiny-llama", "prompts.n=1", "bench.gen_tokens=6", "bench.repeats=1", "bench.warmup=0")
    spec = ("gate=fixed", "gate.exit_layer=2", "bench.mode=self_speculative", "bench.draft_stop=1.0")
    _, row, summary = run_bench(compose(*args, *spec, f"results.root={tmp_path}"))
    said = " ".join(summary.split())
    assert row["acceptance_rate"] is None and row["status"] == "ok"
    assert "acceptance rate n/a, mean accepted 0.00, tokens per verification 1.00" in said, said
    assert "every token verified at full depth" in said and "kv_policy=full saves no layer" not in said, said


def test_a_study_asked_for_more_sets_than_its_space_holds_ends_when_it_has_them_all():
    """search=skipset-random on tiny-llama asks 300 sets of a space of 256: the study went on proposing repeats
    (1,900 proposals in 8 minutes, nothing said) up to 20 per set asked. Here 2 sublayers, 4 sets, 30 asked: it
    ends once it holds all 4, and says so (what the sweep prints beside the screen)."""
    from sweep.orchestrate.searches.skipstudy import REPEATS, ended

    *_, study = _tiny_study(1, n_trials=30, seed=3, draft_stop=None, names=["a1", "m1"])
    distinct = {t.user_attrs["skip"] for t in study.trials if "repeat_of" not in t.user_attrs}
    assert distinct == {"none", "a1", "m1", "a1+m1"} and len(study.trials) < 4 + REPEATS, len(study.trials)
    said = ended(study, 4, 30)
    assert said == "4 of search.n_trials=30 screened: every one of the 4 candidates its space holds"
    assert ended(study, 4, 3) is None  # a sweep resumed asking fewer than it holds: nothing to say


def test_why_a_study_ended_short_is_said_against_the_sweeps_own_n_trials():
    """The reason was stored as a sentence under the first run's n_trials ("241 of search.n_trials=300" shown to a
    sweep resumed with 100), and 50 repeats in a row was named where the proposals ran out first."""
    from types import SimpleNamespace

    from sweep.orchestrate.searches.skipstudy import ASKS, REPEATS, ended

    def study(why):
        return SimpleNamespace(user_attrs={"ended": why, "space": 256})

    assert ended(study("repeats"), 241, 280) == (
        f"241 of search.n_trials=280 screened: its last {REPEATS} proposals each repeated a candidate it had "
        "screened (its space looks spent)"
    )
    assert ended(study("repeats"), 241, 100) is None
    assert (
        ended(study("asks"), 1, 2)
        == f"1 of search.n_trials=2 screened: its {ASKS} proposals per set asked ran out on repeats"
    )
    assert ended(study(None), 3, 4) is None  # a study that held what it was asked when it ended


def _tiny_study(prompts: int, **kw):
    """tiny-llama's decodes of ``prompts`` chat prompts recorded, its cost model, and a seeded random skip-set study on
    them (``kw``: the search's own arguments)."""
    from sweep.bench.costs import cost_model
    from sweep.orchestrate.searches.skipstudy import search

    lm = load("model=tiny-llama")
    rec = record(lm, [p.input_ids for p in chat_prompts(lm, prompts)], N)
    costs = cost_model(lm, rec.prompt_ids[0], kv_policies=[], verify_positions=5)
    args = {"num_layers": 4, "sampler": "random", "ratio": (0.0, 1.0), "draft_len": 4, "costs": costs, **kw}
    return lm, rec, costs, search(lambda skip: first_drafts(lm, rec, skip), **args)
