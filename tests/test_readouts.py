"""Learned readouts (`sweep fit`): tuned-lens translators, exit classifiers, their file and the command."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from conftest import compose, load, run_cli
from sweep.cli.commands import main
from sweep.errors import ConfigError
from sweep.decode.states import decode_states
from sweep.models.prompts import Prompt, read_prompts, tokenize_prompts
from sweep.gates.readouts import TENSORS, Readouts, check_disjoint, content_digest, load_readouts
from sweep.gates import LENSES
from sweep.trace.readouts import fit_readouts, save_readouts

GEN = 8


def prompts_for(lm, *overrides: str) -> list[Prompt]:
    cfg = compose("prompts=chat", *overrides).prompts
    return tokenize_prompts(read_prompts(cfg), cfg, lm.tokenizer)


def fit(lm, prompts, **settings) -> Readouts:
    args = dict(gen_tokens=GEN, ridge=1.0, l2=1e-3, seed=0, prompt_set="chat", prompt_start=0) | settings
    return fit_readouts(lm, prompts, **args)


def identity(lm) -> Readouts:
    """Readouts whose translators are all the identity (D = 0, b = 0)."""
    n, hidden = lm.num_layers - 1, lm.model.config.hidden_size
    shapes = dict(zip(TENSORS, [(n, hidden, hidden), (n, hidden), *[(n, hidden + 2), (n,)] * len(LENSES)]))
    weights = {k: torch.zeros(shape) for k, shape in shapes.items()}
    meta = {"num_layers": str(lm.num_layers), "hidden": str(hidden)}
    return Readouts(weights, meta, content_digest(weights, meta), final_norm=lm.adapter.norm)


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text, text
    return text


@pytest.fixture(scope="module")
def fitted(tiny):
    """Readouts of each tiny family fitted on 4 chat prompts."""
    prompts = prompts_for(tiny, "prompts.n=4")
    return tiny, prompts, fit(tiny, prompts)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Readouts of tiny-llama fitted on chat/0..chat/2 and written to a file."""
    lm = load("model=tiny-llama")
    readouts = fit(lm, prompts_for(lm, "prompts.n=3"), gen_tokens=4)
    return lm, readouts, save_readouts(readouts, tmp_path_factory.mktemp("readouts"))


# --- translators and classifiers ---------------------------------------------------------------------------------


def test_an_identity_translator_is_the_logit_lens_exactly(tiny):
    readouts, adapter, L = identity(tiny), tiny.adapter, tiny.num_layers
    prompt = prompts_for(tiny, "prompts.n=1")[0]
    hs = decode_states(tiny, prompt.input_ids, n_tokens=4).states
    for layer in range(1, L + 1):
        h = hs[layer][0]
        assert readouts.translate(layer, h) is h
        assert torch.equal(readouts.lens(adapter, layer, h, "tuned"), adapter.lens(h))
        assert torch.equal(readouts.lens(adapter, layer, h[-1:], "tuned"), adapter.lens(h[-1:]))  # one row, as probed
        assert readouts.to("cpu", torch.bfloat16).translate(layer, h) is h
    gen = torch.Generator().manual_seed(0)
    weights = dict(readouts.weights, **{"translator.weight": readouts.weights["translator.weight"].clone()})
    weights["translator.weight"][0] = 0.2 * torch.randn(weights["translator.weight"][0].shape, generator=gen)
    moved = Readouts(weights, readouts.meta, "", final_norm=tiny.adapter.norm)
    h1, h2 = hs[1][0], hs[2][0]
    assert not torch.allclose(moved.lens(adapter, 1, h1, "tuned"), adapter.lens(h1), atol=1e-3)
    assert torch.equal(moved.lens(adapter, 2, h2, "tuned"), adapter.lens(h2))  # the other layers untouched


def test_fitting_lowers_the_kl_to_the_final_layer_and_the_classifier_beats_the_majority(fitted):
    lm, prompts, readouts = fitted
    adapter, L = lm.adapter, lm.num_layers
    kl = {lens: torch.zeros(L, dtype=torch.float64) for lens in LENSES}
    hits = {lens: [[] for _ in range(L)] for lens in LENSES}
    probs = {lens: [[] for _ in range(L)] for lens in LENSES}
    positions = 0
    for prompt in prompts:
        decoded = decode_states(lm, prompt.input_ids, n_tokens=GEN)
        hs, P = decoded.states, len(prompt.input_ids)
        logp_final = torch.log_softmax(adapter.lens(hs[L][0, 1:]).double(), dim=-1)
        final = torch.tensor(decoded.greedy)
        positions += hs[0].shape[1] - 1
        for layer in range(1, L):
            for lens in LENSES:
                logp = torch.log_softmax(readouts.lens(adapter, layer, hs[layer][0, 1:], lens).double(), dim=-1)
                kl[lens][layer] += (logp_final.exp() * (logp_final - logp)).sum()
                z = readouts.lens(adapter, layer, hs[layer][0, P - 1 :], lens)
                hits[lens][layer].append(z.argmax(-1) == final)
                probs[lens][layer].append(
                    readouts.classifier_prob(layer, hs[layer][0, P - 1 :], hs[layer - 1][0, P - 1 :], lens)
                )
    better = [layer for layer in range(1, L) if kl["tuned"][layer] < kl["logit"][layer]]
    assert len(better) > (L - 1) / 2, (kl["logit"] / positions, kl["tuned"] / positions)
    for lens in LENSES:
        for layer in range(1, L):
            label, p = torch.cat(hits[lens][layer]), torch.cat(probs[lens][layer])
            assert p.dtype == torch.float32 and bool(((p >= 0) & (p <= 1)).all())
            rate = label.float().mean().item()
            accuracy = ((p >= 0.5) == label).float().mean().item()
            assert accuracy >= max(rate, 1 - rate) - 0.05, (lens, layer, accuracy, rate)
    h = torch.randn(3, lm.model.config.hidden_size)
    assert torch.equal(readouts.classifier_prob(L, h, h, "logit"), torch.ones(3))  # layer L is the final layer


def test_readouts_load_on_the_models_device_and_dtype(saved):
    lm, readouts, path = saved
    loaded = load_readouts(path, lm)
    assert loaded.path == path and loaded.digest == readouts.digest and loaded.meta == readouts.meta
    assert all(torch.equal(loaded.weights[k], readouts.weights[k]) for k in TENSORS)
    assert loaded.prompt_ids == ["chat/0", "chat/1", "chat/2"] and loaded.gen_tokens == 4
    assert (loaded.model, loaded.num_layers, loaded.hidden) == ("tiny-llama", lm.num_layers, 64)
    assert loaded.model_hash == lm.content_hash and len(loaded.prompt_digests) == 3
    half = load("model=tiny-llama", "dtype=bfloat16")  # same weights, so the same content hash
    loaded = load_readouts(path, half)
    assert loaded.weights["translator.weight"].dtype == torch.bfloat16
    h = torch.randn(2, 64, dtype=torch.bfloat16)
    assert loaded.translate(1, h).dtype == torch.bfloat16
    assert loaded.classifier_prob(1, h, h * 0.9, "tuned").dtype == torch.float32


# --- the file ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("other", ["model=tiny-llama seed=1", "model=tiny-qwen3"])
def test_readouts_of_another_model_are_refused(saved, other):
    lm, _, path = saved
    another = load(*other.split())
    with pytest.raises(ConfigError) as exc:
        load_readouts(path, another)
    text = one_line(exc)
    assert text.startswith(f"gate.readouts={path}: fitted to model tiny-llama (hash {lm.content_hash[:20]}")
    assert f"not {another.name} (hash {another.content_hash[:20]}" in text
    with pytest.raises(ConfigError, match=r"^bench\.readouts="):
        load_readouts(path, another, key="bench.readouts")


def rewrite(path, target, change_tensors=None, change_meta=None):
    with safe_open(str(path), framework="pt") as f:
        meta, tensors = dict(f.metadata()), {k: f.get_tensor(k) for k in f.keys()}
    if change_tensors:
        change_tensors(tensors)
    if change_meta:
        change_meta(meta)
    save_file(tensors, str(target), metadata=meta)
    return target


def test_a_tampered_renamed_garbage_or_missing_file_is_refused_in_one_line(saved, tmp_path):
    lm, readouts, path = saved

    def bump(tensors):
        tensors["translator.weight"][0, 0, 0] += 1.0

    def other_prompts(meta):
        meta["prompt_ids"] = json.dumps(["chat/7", "chat/8", "chat/9"])

    (tmp_path / "meta").mkdir()
    cases = {
        "a tensor": rewrite(path, tmp_path / path.name, change_tensors=bump),
        "the metadata": rewrite(path, tmp_path / "meta" / path.name, change_meta=other_prompts),
    }
    for what, target in cases.items():
        with pytest.raises(ConfigError) as exc:
            load_readouts(target, lm)
        assert one_line(exc) == f"gate.readouts={target}: was modified after it was written " + (
            "(its content no longer hashes to its digest)"
        ), what
    renamed = shutil.copy(path, tmp_path / ("0" * 16 + ".safetensors"))  # intact, under another fit's name
    with pytest.raises(ConfigError) as exc:
        load_readouts(renamed, lm)
    assert one_line(exc) == (
        f"gate.readouts={renamed}: its content is intact, but a name of 16 hex digits must be its digest's: rename "
        f"it {readouts.digest[:16]}.safetensors, as `sweep fit` named it (or give it a name of your own)"
    )
    assert load_readouts(shutil.copy(path, tmp_path / "my-readouts.safetensors"), lm).digest == readouts.digest
    (tmp_path / "garbage.safetensors").write_bytes(b"\x00\xff not a safetensors file" * 8)
    (tmp_path / "empty.safetensors").write_bytes(b"")
    save_file({"x": torch.zeros(2)}, str(tmp_path / "foreign.safetensors"))
    expected = {
        "garbage.safetensors": "not a readable safetensors file",
        "empty.safetensors": "not a readable safetensors file",
        "foreign.safetensors": "not a readouts file from `sweep fit` (missing model, model_hash",
        "missing.safetensors": "no such file",
    }
    for name, message in expected.items():
        with pytest.raises(ConfigError) as exc:
            load_readouts(tmp_path / name, lm)
        assert one_line(exc).startswith(f"gate.readouts={tmp_path / name}: {message}")


def test_the_path_is_content_addressed(saved, tmp_path):
    lm, readouts, _ = saved
    prompts = prompts_for(lm, "prompts.n=3")
    again = fit(lm, prompts, gen_tokens=4)
    assert again.digest == readouts.digest and again.meta["created_at"] and again.meta["fit_seconds"]
    first, second = save_readouts(readouts, tmp_path), save_readouts(again, tmp_path)
    assert first == second == tmp_path / "tiny-llama" / f"{readouts.digest[:16]}.safetensors"
    assert [p.name for p in first.parent.iterdir()] == [first.name]  # no temporary file left behind
    assert all(torch.equal(again.weights[k], readouts.weights[k]) for k in TENSORS)
    others = {fit(lm, prompts, gen_tokens=4, ridge=2.0).digest, fit(lm, prompts, gen_tokens=4, seed=1).digest}
    assert len(others) == 2 and readouts.digest not in others
    with pytest.raises(ValueError, match="do not match the digest"):
        save_readouts(readouts.to("cpu", torch.bfloat16), tmp_path)  # a cast copy is not what the digest names


def test_the_classifiers_are_solved_whatever_the_seed(saved):
    """The classifiers' problem is convex: solved, two seeds give the same weights (a solver stopped early
    leaves each where its start led it)."""
    lm, readouts, _ = saved
    other = fit(lm, prompts_for(lm, "prompts.n=3"), gen_tokens=4, seed=1)
    for name in TENSORS[2:]:
        a, b = readouts.weights[name], other.weights[name]
        if name.endswith("bias"):  # a layer whose labels are all one class has its bias's optimum at infinity
            finite = a.abs() < 15
            assert finite.sum() >= 2
            a, b = a[finite], b[finite]
        assert (a - b).abs().max() < 2e-5, name


def test_a_classifier_the_solver_could_not_finish_is_said(saved, monkeypatch, caplog):
    import sweep.trace.readouts as fitting

    lm, _, _ = saved
    monkeypatch.setattr(fitting, "_LBFGS_ITERS", 1)  # a cap the problem cannot be solved within
    with caplog.at_level("WARNING", logger="sweep.trace.readouts"):
        fit(lm, prompts_for(lm, "prompts.n=3"), gen_tokens=4)
    said = [r.getMessage() for r in caplog.records if "an exit classifier stopped" in r.getMessage()]
    assert said and all("after 1 iterations" in line and "not the optimum" in line for line in said)


def test_a_readouts_file_is_readable_as_rows_are(saved, tmp_path):
    import os
    import stat

    lm, readouts, _ = saved
    mask = os.umask(0o022)
    try:
        path = save_readouts(readouts, tmp_path)
    finally:
        os.umask(mask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


# --- fitting set and evaluation set ------------------------------------------------------------------------------


def test_evaluation_prompts_must_be_disjoint_from_the_fitting_set(saved):
    lm, readouts, _ = saved
    assert [p.id for p in prompts_for(lm, "prompts.start=4", "prompts.n=3")] == ["chat/4", "chat/5", "chat/6"]
    check_disjoint(readouts, prompts_for(lm, "prompts.start=4", "prompts.n=3"))
    same = prompts_for(lm, "prompts.n=3")
    with pytest.raises(ConfigError) as exc:
        check_disjoint(readouts, same)
    assert one_line(exc).startswith("prompts: 3 of 3 evaluation prompts (chat/0, chat/1, chat/2) are in the readouts'")
    with pytest.raises(ConfigError, match=r"^prompts: 1 of 3 evaluation prompts \(chat/2\)"):
        check_disjoint(readouts, prompts_for(lm, "prompts.start=2", "prompts.n=3"))
    renamed = [Prompt("mine/0", same[1].text, same[1].input_ids)]  # the same text under another id
    with pytest.raises(ConfigError, match=r"^bench: 1 of 1 evaluation prompts \(mine/0\)"):
        check_disjoint(readouts, renamed, key="bench")


# --- `sweep fit` -------------------------------------------------------------------------------------------------


def test_sweep_fit_writes_the_readouts_and_prints_their_path(tmp_path, capsys):
    args = ["fit", "model=tiny-llama", "prompts=chat", "prompts.start=1", "prompts.n=2", "fit.gen_tokens=4"]
    assert main([*args, f"results.root={tmp_path}"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    match = re.fullmatch(r"readouts: (.+)", out[-1])
    assert match and match.group(1).startswith(str(tmp_path / "readouts" / "tiny-llama"))
    lm = load("model=tiny-llama")
    loaded = load_readouts(match.group(1), lm)
    assert loaded.prompt_ids == ["chat/1", "chat/2"] and loaded.meta["prompt_start"] == "1"
    head = next(i for i, line in enumerate(out) if line.split()[:1] == ["layer"])  # the table's header
    assert [line.split()[0] for line in out[head + 1 : -1]] == [str(layer) for layer in range(1, lm.num_layers)]
    assert main([*args, f"results.root={tmp_path}", f"fit.out={tmp_path / 'elsewhere'}"]) == 0
    assert (
        capsys.readouterr().out.strip().splitlines()[-1].startswith(f"readouts: {tmp_path / 'elsewhere'}/tiny-llama/")
    )


def test_sweep_fit_checks_its_files_directory_before_it_fits(tmp_path, capsys):
    """A file where the readouts' model directory goes: one line naming fit.out, before any fit; a results.root
    that cannot be written does not matter where fit.out takes the file."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "tiny-llama").write_text("not a directory")
    args = ["fit", "model=tiny-llama", "prompts.n=1", "fit.gen_tokens=2"]
    assert main([*args, f"fit.out={tmp_path / 'out'}", f"results.root={tmp_path / 'r'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    where = tmp_path / "out" / "tiny-llama"
    assert err == [f"error: fit.out={tmp_path / 'out'}: {where}, where the readouts go, is not a directory"]
    (tmp_path / "a-file").write_text("")
    assert main([*args, f"fit.out={tmp_path / 'elsewhere'}", f"results.root={tmp_path / 'a-file'}"]) == 0
    assert len(list((tmp_path / "elsewhere" / "tiny-llama").glob("*.safetensors"))) == 1


def test_sweep_fit_refuses_a_bad_value_in_one_line(tmp_path, capsys):
    assert main(["fit", "model=tiny-llama", "fit.ridge=-1", f"results.root={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: fit.ridge=-1")
    assert not (tmp_path / "readouts").exists()


def test_a_session_loads_one_file_once_and_again_when_it_changes(saved, tmp_path):
    """Trials of a sweep worker (one session) share one verified load; a file rewritten in place is read
    anew (and refused when its content no longer matches its name)."""
    import os
    import shutil

    from sweep.bench.session import Session

    lm, _, path = saved
    src = tmp_path / path.name
    shutil.copyfile(path, src)
    cache = Session().readouts
    first = load_readouts(src, lm, cache=cache)
    assert load_readouts(src, lm, cache=cache) is first
    assert load_readouts(src, lm) is not first  # without a session's cache: loaded and verified again
    other = save_readouts(fit(lm, prompts_for(lm, "prompts.n=3"), gen_tokens=4, seed=1), tmp_path / "b")
    shutil.copyfile(other, src)  # another fit's bytes under the first one's name
    os.utime(src, ns=(1, 1))
    with pytest.raises(ConfigError, match="must be its digest's"):
        load_readouts(src, lm, cache=cache)


def test_readouts_with_non_finite_weights_or_not_a_regular_file_are_refused(saved, tmp_path):
    """A file whose digest was recomputed over NaN weights passes every content check but this one; a FIFO in
    place of the file is refused without being opened (it would block a read)."""
    import os

    lm, readouts, path = saved

    def poison(tensors):
        tensors["translator.weight"][0, 0, 0] = float("nan")

    def redigest(meta):
        with safe_open(str(path), framework="pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        poison(tensors)
        meta.pop("digest")
        meta["digest"] = content_digest(tensors, meta)

    target = rewrite(path, tmp_path / "nan.safetensors", poison, redigest)
    with pytest.raises(ConfigError, match=r"non-finite weights \(NaN or inf\): translator.weight"):
        load_readouts(target, lm)
    fifo = tmp_path / "fifo.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_readouts(fifo, lm)


def test_a_sweep_over_prompts_its_readouts_were_fitted_on_is_refused_before_ray(saved, tmp_path):
    """`sweep run` with a classifier space on the readouts' own fitting prompts started Ray, ran each setting to a
    failed row ("2 of 2 evaluation prompts ... are in the readouts' fitting set"), and ended rc 1 (a reader's; the
    docs promise the refusal in `run` too). Now one line before Ray, rc 2, nothing written."""
    _, _, path = saved  # fitted on chat/0 .. chat/2
    space = f"search.spaces=[{{gate: classifier, gate.readouts: '{path}', gate.theta: 'choice(0.9,0.8)'}}]"
    args = ["model=tiny-llama", space, "prompts=chat", "bench.gen_tokens=2", "bench.repeats=1"]
    done = run_cli("run", *args, "prompts.n=2", f"results.root={tmp_path}", timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: prompts: 2 of 2 evaluation prompts (chat/0, chat/1) are in the readouts' fitting set (chat: chat/0 .. "
        "chat/2, 3 prompts); evaluate on others (prompts.start, prompts.n)"
    ], done.stderr[-2000:]
    assert not list(tmp_path.iterdir())  # no row, no Tune state


def test_a_fit_too_small_to_tell_anything_says_so(tmp_path, caplog):
    """`sweep fit fit.ridge=0 prompts.n=1 fit.gen_tokens=1` printed KL 0.000, top1 1.000 and acc 1.000 on every
    layer, rc 0, nothing said (a reader's): 57 positions for 65 unknowns, and classifiers fitted on one label."""
    import logging

    with caplog.at_level(logging.WARNING, logger="sweep.trace.readouts"):
        code = main(["fit", "model=tiny-llama", "fit.ridge=0", "prompts=chat", "prompts.n=1", "fit.gen_tokens=1",
                     f"fit.out={tmp_path}"])  # fmt: skip
    said = " ".join(r.getMessage() for r in caplog.records if r.name == "sweep.trace.readouts")
    assert code == 0
    assert (
        "the translators were fitted on 57 positions for 65 unknowns per output (hidden 64 + 1): with fit.ridge=0"
        in said
    )
    assert "the exit classifiers of layer(s) 1, 2, 3 saw one label only on the 1 decision positions" in said
