"""The contract every family passes, on its seeded tiny model (``sweep.config.families.TINY``: random norm
scales and biases, 4 layers): the fidelity check finds the model's own parts, a skipped layer's K/V
equal what the layer itself caches from h at the exit, the profile decodes what ``generate()``
decodes, every gate exits in the engine, replays as the engine decides and decodes a batch of two
as alone, and the bench runs full depth (agreement 1.0, deterministic), fixed and saturation under
both K/V policies; state-space and hybrid models refuse kv_policy=propagate and self-speculation
in one line."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import pytest
import torch

from conftest import ALL_TINY, REPRESENTATIVE, ROOT, compose, family_params, load, run_cli
from helpers.contract import (
    N,
    base_setting,
    chat_prompts,
    each_sequence_decides_as_it_would_alone,
    mixed_setting,
    replay_equals_engine,
    trace_of,
)
from sweep.decode.engine import Engine
from sweep.errors import ConfigError
from sweep.config.families import FAST_KV, TINY
from sweep.gates import GATES, make_gate
from sweep.models._fidelity import rel_err
from sweep.decode.states import decode_states

ATTENTION = [f for f in ALL_TINY if TINY[f].kind in ("dense", "moe")]
RECURRENT = [f for f in ALL_TINY if TINY[f].kind in ("ssm", "hybrid")]
# other init scales, where the lens converges enough for the conformal certificate to fire at some positions
CONVERGING_INITS = (0.02, 0.03, 0.017, 0.05, 0.5, 1.0, 0.01)


@dataclass
class Traced:
    family: str
    lm: object
    prompts: list
    sig: object
    baseline: dict


def traced(family: str, *init: str, readouts=None) -> Traced:
    lm = load(f"model=tiny-{family}", *init)
    prompts, sig = trace_of(lm, readouts)
    baseline = {p.id: Engine(lm).generate(p.input_ids, N).tokens for p in prompts}
    return Traced(family, lm, prompts, sig, baseline)


@pytest.fixture(scope="module", params=family_params(ALL_TINY))
def fam(request) -> Traced:
    return traced(request.param)


def test_the_representative_families_cover_every_kind_and_adapter_path():
    """The fast tier's families: every kind, both K/V fills (the stacked one where the model type has a fast
    path, the generic one), and a vision-language wrapper."""
    kinds = {TINY[f].kind for f in REPRESENTATIVE}
    assert kinds == {t.kind for t in TINY.values()}
    paths = {load(f"model=tiny-{f}").adapter.kv_path for f in REPRESENTATIVE if TINY[f].kind in ("dense", "moe")}
    assert paths == {"fast", "generic"}
    assert any(TINY[f].multimodal for f in REPRESENTATIVE)


def test_every_family_has_a_conf_file():
    from sweep.config import compose as compose_cfg

    for family in ALL_TINY:
        assert compose_cfg([f"model=tiny-{family}"]).model.family == family


def test_the_tiny_model_is_tiny(fam):
    lm = fam.lm
    assert sum(p.numel() for p in lm.model.parameters()) < 1_000_000
    assert lm.num_layers == 4 and lm.adapter.config.hidden_size == 64
    assert lm.adapter.lm_head.weight.shape[0] == len(lm.tokenizer) == 260


def test_the_shape_read_before_the_load_is_the_loaded_models(fam):
    """What a gate is checked against before a model loads (``sweep.models.shape_before_load``) is what the loaded
    model has: its adapter's layer list and its head's width, for every family (tests/test_real_model.py and
    tests/test_split_model.py hold the packaged GGUFs' headers against their loads)."""
    from sweep.models import Shape, shape_before_load

    shape = shape_before_load(compose(f"model=tiny-{fam.family}").model)
    assert shape == Shape(len(fam.lm.adapter.layers), fam.lm.adapter.lm_head.weight.shape[1])


BATCH_REFUSED = {"mamba"}  # its own forward's left padding is not exact (transformers' Mamba, 5.24)


def test_the_fidelity_check_finds_the_models_own_parts(fam):
    fid, a = fam.lm.fidelity, fam.lm.adapter
    assert fid.lens_ok and fid.step_ok, fid
    assert fid.batch_ok == (fam.family not in BATCH_REFUSED), fid.batch_err
    assert fid.lens_err <= 1e-5 and fid.step_err <= 1e-4
    if TINY[fam.family].kind in ("ssm", "hybrid"):
        assert a.kind == TINY[fam.family].kind and a.kv_path is None and fid.kv_err is None
        assert "recurrent state" in fid.kv_refusal
    else:
        assert a.kind == "attention" and fid.kv_err <= 1e-5
        assert a.kv_path == ("fast" if a.config.model_type in FAST_KV else "generic")


@torch.inference_mode()
def independent_kv(lm, ids: list[int], h: torch.Tensor, first: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """What every layer from ``first`` on (0-based) caches for the last position of ``ids`` when its input
    there is ``h``: the model's own forward over the whole sequence from an empty cache, each of those
    layers' inputs at the last position replaced by a forward pre-hook (no adapter code involved)."""

    def substitute(_module, args, kwargs):
        x = (args[0] if args else kwargs["hidden_states"]).clone()
        x[:, -1:] = h.to(x.dtype)
        return ((x, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": x})

    layers = lm.adapter.layers
    handles = [layers[j].register_forward_pre_hook(substitute, with_kwargs=True) for j in range(first, len(layers))]
    cache = lm.adapter.new_cache()
    try:
        lm.model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True)
    finally:
        for handle in handles:
            handle.remove()
    return [(cache.layers[j].keys[:, :, -1:], cache.layers[j].values[:, :, -1:]) for j in range(len(layers))]


@pytest.mark.parametrize("path", ["fast", "generic"])
@pytest.mark.parametrize("family", family_params(ATTENTION))
def test_a_skipped_layers_kv_equal_what_the_layer_caches_from_h_at_the_exit(family, path):
    """kv_policy=propagate, exits after layer 1 at every decode step: layers 2..L of each decoded position
    hold the K/V the layer itself computes from h_1, to 1e-5 in float32, on both fill paths (generic on
    every family; fast where the model type has one)."""
    lm = load(f"model=tiny-{family}")
    if path == "fast" and lm.adapter.config.model_type not in FAST_KV:
        pytest.skip("no fast path for this model type")
    from sweep.config import GateConfig

    taken = lm.adapter.kv_path
    lm.adapter.kv_path = path
    try:
        gate = make_gate(GateConfig(name="fixed", min_layer=1, exit_layer=1), lm)
        prompt = chat_prompts(lm, 1)[0].input_ids
        gen = Engine(lm, gate, "propagate").generate(prompt, N, record=True, keep_cache=True)
    finally:
        lm.adapter.kv_path = taken
    assert gen.exit_layers[1:] == [1] * (N - 1)
    worst = 0.0
    for i in range(1, N):  # step i fed token i - 1 at position P + i - 1; the cache ends at P + N - 2
        expected = independent_kv(lm, list(prompt) + gen.tokens[:i], gen.exit_hidden[i], first=1)
        back = N - i  # that position's place from the end of every layer's cache (sliding ones too)
        for j in range(1, lm.num_layers):
            entry = gen.cache.layers[j]
            k, v = entry.keys[:, :, -back:][:, :, :1], entry.values[:, :, -back:][:, :, :1]
            worst = max(worst, rel_err(k, expected[j][0]), rel_err(v, expected[j][1]))
    assert worst <= 1e-5, worst


def test_the_profile_decodes_what_generate_decodes(fam):
    from transformers import GenerationConfig

    lm = fam.lm
    greedy = GenerationConfig(max_new_tokens=N, do_sample=False, pad_token_id=0)
    for prompt in fam.prompts:
        ids = torch.tensor([list(prompt.input_ids)])
        with torch.inference_mode():
            own = lm.model.generate(ids, generation_config=greedy)[0, ids.shape[1] :].tolist()
        # generate() stops at EOS, the profile decodes exactly N tokens: equal as far as generate() went
        assert len(own) == N or own[-1] == lm.tokenizer.eos_token_id
        assert decode_states(lm, prompt.input_ids, n_tokens=N).tokens[: len(own)] == own
        assert fam.baseline[prompt.id][: len(own)] == own  # the engine's full depth too


@pytest.fixture(scope="module")
def readouts_of(tmp_path_factory):
    """Readouts fitted per family on chat 2..4 (the classifier gate's), built on first use."""
    from sweep.trace.readouts import fit_readouts
    from sweep.trace.readouts import save_readouts

    built: dict = {}

    def get(family: str):
        if family not in built:
            lm = load(f"model=tiny-{family}")
            prompts = chat_prompts(lm, 3, start=2)
            fit = fit_readouts(lm, prompts, gen_tokens=6, ridge=1.0, l2=1e-3, seed=0, prompt_set="chat", prompt_start=2)
            path = save_readouts(fit, tmp_path_factory.mktemp(f"readouts-{family}"))
            from sweep.gates.readouts import load_readouts

            built[family] = (str(path), load_readouts(str(path), lm))
        return built[family]

    return get


def converging(family: str, name: str):
    """A traced variant of the family whose lens converges enough for ``name`` (conformal) to decide."""
    for init in CONVERGING_INITS:
        t = traced(family, f"model.tiny.init_std={init}")
        setting = mixed_setting(name, t.sig, t.lm.num_layers)
        if setting is not None:
            return t, setting
    pytest.fail(f"gate={name} decides nothing on tiny-{family} at init_std {CONVERGING_INITS}")


@functools.cache
def per_family(name: str) -> bool:
    """A gate whose code meets what differs between families: its probe (how it reads layer l: none, the hidden
    state, the lens with the family's final norm and logit scalars, the head's principal directions, fitted
    readouts) seen first among the registered gates, or a calibration over the prefill. The others run on the
    representative families (their paths are these gates')."""
    spec = GATES.get(name, key="gate")
    first = {s.probe: s.name for s in reversed(list(GATES)) if s.threshold is not None}
    return first.get(spec.probe) == name or make_gate(base_setting(name), 4).calibration_lenses() > 0


GATE_MATRIX = [
    pytest.param(family, name, marks=() if family in REPRESENTATIVE else pytest.mark.families, id=f"{family}-{name}")
    for family in ALL_TINY
    for name in sorted(GATES.names())
    if family in REPRESENTATIVE or per_family(name)
]


@pytest.mark.parametrize("fam, name", GATE_MATRIX, indirect=["fam"])
def test_every_gate_exits_replays_as_the_engine_and_batches_as_alone(fam, name, readouts_of):
    spec, t, readouts, path = GATES.get(name, key="gate"), fam, None, None
    if spec.readouts:  # fitted on chat 2..4, judged on chat 0..1
        path, readouts = readouts_of(fam.family)
        t = traced(fam.family, readouts=readouts)
    setting = mixed_setting(name, t.sig, t.lm.num_layers, path)
    if setting is None and make_gate(base_setting(name), 4).calibration_lenses() > 0:  # a certificate
        t, setting = converging(fam.family, name)
    assert setting is not None, f"gate={name}: no threshold decides on tiny-{fam.family}"
    lm, L = t.lm, t.lm.num_layers
    _, exits, compared = replay_equals_engine(lm, t.prompts, t.sig, t.baseline, setting, readouts)
    assert compared >= len(t.prompts)
    early = sum(e < L for e in exits)
    if spec.threshold is None:  # never exits (skip names a self-speculative draft)
        assert early == 0
    else:
        assert early > 0, f"gate={name} never exits on tiny-{fam.family}"
        if spec.unit(spec.threshold) != "layer":  # a fixed exit layer exits at every step
            assert early < len(exits), f"gate={name} exits at every step: its threshold decides nothing"
    pair = [list(p.input_ids) for p in t.prompts[:2]]
    assert len(pair[0]) != len(pair[1])  # left padding is exercised
    if not lm.fidelity.batch_ok:  # the model's own forward does not decode a padded batch as alone
        with pytest.raises(ConfigError, match=r"bench.batch_size=2: refused for model=.*a left-padded batch"):
            lm.require(batch_size=2)
        return
    policies = ["full", "propagate"] if TINY[fam.family].kind in ("dense", "moe") else ["full"]
    for policy in policies:
        together = each_sequence_decides_as_it_would_alone(lm, pair, setting, policy, readouts)
        assert any(e < L for row in together.exit_layers for e in row) == (spec.threshold is not None)


BENCH = ["prompts.n=2", "bench.gen_tokens=6", "bench.repeats=1", "bench.warmup=0"]


def bench_row(family: str, *overrides: str) -> dict:
    from sweep.bench.command import prepare
    from sweep.bench.protocol import run_trial

    cfg = compose(f"model=tiny-{family}", *BENCH, *overrides)
    lm, gate, prompts = prepare(cfg)
    return run_trial(cfg, lm, gate, prompts)


def test_the_bench_at_full_depth_agrees_and_is_deterministic(fam):
    row = bench_row(fam.family, "gate=full")
    assert row["status"] == "ok" and row["deterministic"] and row["agreement"] == 1.0


@pytest.mark.parametrize("policy", ["full", "propagate"])
@pytest.mark.parametrize("gate", ["gate=fixed gate.min_depth=0.5", "gate=saturation gate.eps=0.5 gate.min_layer=1"])
def test_fixed_and_saturation_bench_under_both_kv_policies(fam, gate, policy):
    overrides = (*gate.split(), f"bench.kv_policy={policy}")
    if policy == "propagate" and TINY[fam.family].kind in ("ssm", "hybrid"):
        with pytest.raises(ConfigError, match=r"bench.kv_policy=propagate: refused for model=tiny-.*recurrent state"):
            bench_row(fam.family, *overrides)
        return
    row = bench_row(fam.family, *overrides)
    assert row["status"] == "ok" and row["deterministic"], row.get("error")
    if gate.startswith("gate=fixed"):
        assert row["exit_rate"] == 1.0 and row["mean_exit_layer"] == 2


@pytest.mark.slow  # a program's start and its imports: 5 s or more of the fast tier (benchmarks/RESULTS.md)
def test_a_padded_batch_the_model_cannot_decode_as_alone_is_refused_in_one_line(tmp_path):
    """Mamba's own forward does not decode a left-padded batch as each row alone: both rows differ (an
    independent check here, without the fidelity check), and bench.batch_size=2 is refused, rc 2."""
    from sweep.decode.batching import BatchEngine

    lm = load("model=tiny-mamba")
    pair = [p.input_ids for p in chat_prompts(lm, 2)]
    together = BatchEngine(lm).generate_batch(pair, N).tokens
    assert together != [Engine(lm).generate(p, N).tokens for p in pair]
    out = run_cli("bench", "model=tiny-mamba", "bench.batch_size=2", "bench.kv_policy=full", f"results.root={tmp_path}")
    assert out.returncode == 2 and "bench.batch_size=2: refused for model=tiny-mamba" in out.stderr


def _windows(lm) -> list[int]:
    config = getattr(lm.model.config, "text_config", None) or lm.model.config
    types = getattr(config, "layer_types", None)
    window = getattr(config, "sliding_window", None)
    return [window] if window and (types is None or any("sliding" in t for t in types)) else []


@pytest.mark.parametrize("family", family_params(ALL_TINY))
def test_self_speculation_is_lossless_past_the_sliding_window_or_refused_by_check_e(family):
    """Prefix and skip-set drafts on the model's own cache (sliding-window and state-space layers rolled back
    through past recording): the tokens are full depth's, on a prompt that with its generation runs past the
    smallest sliding window; skip sets name each family's own sublayers (a state-space mixer too), and a hybrid
    drafts with its state-space path alone (attention-free)."""
    from sweep.decode.speculative import PrefixDraft, SelfSpeculative, SkipDraft
    from sweep.gates.skipset import SkipSet

    lm = load(f"model=tiny-{family}")
    assert lm.fidelity.rollback_ok and lm.fidelity.rollback_err <= 1e-5  # every family passes check (e) here
    windows = _windows(lm)
    words = " ".join(p.text for p in chat_prompts(lm, 4))
    prompt = lm.tokenizer(words)["input_ids"][: (min(windows) - 4 if windows else 40)]
    n = 16
    assert not windows or len(prompt) + n > min(windows)  # the generation crosses the window
    full = Engine(lm).generate(prompt, n).tokens
    drafts = [PrefixDraft(lm, 1), PrefixDraft(lm, lm.num_layers - 1)]
    kinds = [set(lm.adapter.sublayers(i)) for i in range(lm.num_layers)]
    # a set each family can name: the first layer's mixer or attention and the second's MLP or mixer
    first = "s1" if "s" in kinds[0] and "a" not in kinds[0] else "a1"
    second = "m2" if "m" in kinds[1] else "s2"
    drafts.append(SkipDraft(lm, SkipSet.parse(f"{first}+{second}")))
    if any("a" in k for k in kinds) and any("s" in k for k in kinds):  # a hybrid: its state-space path alone
        drafts.append(SkipDraft(lm, SkipSet.parse("attention-free")))
    for draft in drafts:
        for draft_len in (1, 3):
            gen = SelfSpeculative(lm, draft, draft_len).generate(prompt, n)
            assert gen.tokens == full, (type(draft).__name__, draft_len)
            assert gen.drafted > 0


def test_a_cache_that_does_not_roll_back_fails_check_e_and_refuses_self_speculation(monkeypatch):
    """Check (e) can fail: with past recording switched off, a sliding window passed and a state-space layer's state
    cannot be restored, and self-speculation is refused in one line naming the check."""
    from sweep.decode.speculative import PrefixDraft, SelfSpeculative
    from sweep.models import load_model
    from sweep.models._adapter import Adapter

    plain = Adapter.new_cache
    monkeypatch.setattr(Adapter, "new_cache", lambda self, record=None: plain(self))
    for family in ("gemma2", "mamba"):
        cfg = compose(f"model=tiny-{family}")
        lm = load_model(cfg.model, device="cpu", dtype="float32", seed=cfg.seed)
        assert not lm.fidelity.rollback_ok
        with pytest.raises(ConfigError, match=r"refused for model=tiny-.*fidelity check \(e\)"):
            SelfSpeculative(lm, PrefixDraft(lm, 1), 2)


@pytest.mark.slow  # a program's start and its imports: 5 s or more of the fast tier (benchmarks/RESULTS.md)
def test_propagate_on_a_state_space_model_is_one_line_and_rc_2(tmp_path):
    out = run_cli("bench", "model=tiny-mamba", "gate=fixed", "gate.exit_layer=2", f"results.root={tmp_path}", *BENCH)
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "bench.kv_policy=propagate: refused for model=tiny-mamba" in lines[0]
    assert "use bench.kv_policy=full" in lines[0] and "Traceback" not in out.stderr
    assert not list(tmp_path.rglob("*.parquet"))  # nothing written


def test_granites_lens_margins_equal_the_models_own():
    """logits_scaling=8: the lens at layer L divides by it as the model does, so its margins are the model's."""
    lm = load("model=tiny-granite")
    assert lm.adapter.config.logits_scaling == 8.0
    ids = torch.tensor([list(chat_prompts(lm, 1)[0].input_ids)])
    with torch.inference_mode(), lm.adapter.capture_hidden() as hs:
        own = lm.model(input_ids=ids).logits[0].float()
    lens = lm.adapter.lens(hs[-1])[0].float()
    own_margin, lens_margin = (z.topk(2).values for z in (own, lens))
    margins = own_margin[:, 0] - own_margin[:, 1], lens_margin[:, 0] - lens_margin[:, 1]
    assert torch.allclose(margins[0], margins[1], rtol=1e-5, atol=1e-6)
    unscaled = lm.adapter.lm_head(lm.adapter.norm(hs[-1]))[0].float().topk(2).values
    assert torch.allclose(unscaled[:, 0] - unscaled[:, 1], 8 * margins[0], rtol=1e-4)  # the scale is really there


def test_a_lens_that_misses_a_transform_refuses_exiting_gates_but_runs_full_depth():
    """A model whose forward scales its logits in a way no config key names (as remote code may):
    the check sees the lens differ from the model's logits, and what reads the lens is refused."""
    from sweep.models import Adapter
    from sweep.models._fidelity import check

    lm = load("model=tiny-llama", "seed=5")
    model = lm.model
    own = type(model).forward

    def scaled(self, *args, **kwargs):
        out = own(self, *args, **kwargs)
        out.logits = out.logits * 3.0
        return out

    model.forward = scaled.__get__(model)
    try:
        adapter = Adapter(model, where="model=scaled")
        fid = check(adapter, lm.device)
    finally:
        del model.forward
    assert not fid.lens_ok and fid.lens_err > 0.5 and fid.step_ok and fid.kv_path == "fast"
    broken = dataclasses.replace(lm, name="scaled", adapter=adapter, fidelity=fid)
    with pytest.raises(ConfigError, match=r"model=scaled: the logit lens at layer L does not reproduce"):
        broken.require(lens=True)
    broken.require(kv_policy="propagate")  # the K/V fill is still exact


def test_the_docs_family_table_is_the_codes():
    from sweep.models import family_rows
    from sweep.models import family_table as markdown

    doc = (ROOT / "docs" / "families.md").read_text()
    shown = doc.split("<!-- families:begin -->\n")[1].split("\n<!-- families:end -->")[0]
    assert shown == markdown(family_rows()), "regenerate it: sweep families"


def test_a_model_type_with_no_causal_lm_is_refused_before_its_weights_load(tmp_path):
    from transformers import T5Config

    T5Config(d_model=16, num_layers=1, num_heads=2, d_kv=8, d_ff=32, vocab_size=50).save_pretrained(tmp_path / "t5")
    out = run_cli("profile", "model=hf", f"model.path={tmp_path / 't5'}", f"results.root={tmp_path / 'r'}")
    assert out.returncode == 2
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: model.path={tmp_path / 't5'}: model_type 't5' has no causal-LM class in transformers "
        f"{__import__('transformers').__version__}; sweep measures decoder-only causal LMs"
    ]


@pytest.mark.parametrize("family", ["llama", "phi3"])
def test_the_cost_model_measures_the_fill_of_the_path_taken_and_none_under_full(family):
    from sweep.bench.costs import cost_model

    lm = load(f"model=tiny-{family}", "seed=17")  # a model of its own: a cost model not measured yet
    prompt = list(range(5, 20))
    costs = cost_model(lm, prompt, kv_policies=["full"])
    assert costs.kv_ms is None and costs.fill_ms("full") == costs.layer_ms
    again = cost_model(lm, prompt, kv_policies=["propagate"])
    assert again is costs and costs.kv_ms is not None and costs.kv_ms >= 0
    assert lm.adapter.kv_path == ("fast" if family == "llama" else "generic")
