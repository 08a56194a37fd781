"""benchmarks/gpu_check.sh, the prepared GPU check: its --dry-run runs end to end on the CPU with ray,
optuna, polars, hydra, omegaconf and gguf unimportable (as on the GPU image), and its Hydra-free
composition of conf/ is Hydra's own for every setting it runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from sweep.config import compose, compose_dict, validate
from sweep.errors import ConfigError

sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_check  # noqa: E402
from plain_compose import plain_compose  # noqa: E402

ABSENT = ("ray", "optuna", "polars", "hydra", "omegaconf", "gguf")  # not on the GPU image


def every_setting():
    """What the check runs: its shapes on the GPU, its tiny shapes in the dry run."""
    for shapes, device, (run, _) in (
        (gpu_check.SHAPES, "cuda", gpu_check.RUNS["gpu"]),
        (gpu_check.DRY_SHAPES, "cpu", gpu_check.RUNS["dry"]),
    ):
        for shape in shapes:
            yield from gpu_check.overrides(shape, device, run)


def test_the_plain_composition_is_hydras_for_every_setting():
    settings = list(every_setting())
    shapes = [*gpu_check.SHAPES, *gpu_check.DRY_SHAPES]
    assert len(settings) == sum(len(shape.settings) for shape in shapes) and {s.family for s in shapes} == {
        "llama",
        "falcon-h1",
    }
    for overrides in settings:
        plain = plain_compose(overrides)
        assert plain == compose_dict(overrides), overrides
        if overrides[3] == "device=cpu":  # (validating device=cuda needs no GPU, but compose() resolves nothing)
            assert validate(plain, search=False) == compose(overrides)


def test_the_plain_composition_refuses_what_needs_hydra():
    for bad in (["experiment=main"], ["+bench.extra=1"], ["gate.min_layer=3"]):
        with pytest.raises(ValueError, match="plain_compose takes"):
            plain_compose(bad)
    with pytest.raises(KeyError, match="bench.nope"):
        plain_compose(["bench.nope=1"])


def test_validate_without_the_search_leaves_its_spaces_unparsed():
    data = compose_dict(["gate=fixed"])
    data["search"]["spaces"] = [{"gate.eps": "choice(0.1"}]  # only Hydra's grammar can tell this is bad
    with pytest.raises(ConfigError, match="search.spaces"):
        validate(data)
    assert validate(data, search=False).gate.name == "fixed"


def blocker(tmp_path):
    """Packages that shadow the real ones and refuse to import, noting every attempt in a log."""
    log = tmp_path / "imported.log"
    for name in ABSENT:
        pkg = tmp_path / "absent" / name
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text(
            "import os\n"
            f"open(os.environ['ABSENT_LOG'], 'a').write('{name}\\n')\n"
            f"raise ImportError('{name} is not on the GPU image')\n"
        )
    return tmp_path / "absent", log


@pytest.mark.slow
def test_the_dry_run_runs_end_to_end_without_the_cluster_packages(tmp_path):
    absent, log = blocker(tmp_path)
    out = tmp_path / "out"
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "PYTHONPATH": str(absent),
        "ABSENT_LOG": str(log),
        "OMP_NUM_THREADS": "1",
    }
    env.pop("OUT", None)
    res = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run", "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=240,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert not log.exists(), f"imported: {log.read_text()}"  # none of them was even tried
    text = res.stdout
    assert (out / "gpu_check.txt").read_text() == text and (out / "machine.txt").is_file()
    assert max(len(line) for line in text.splitlines()) <= 120
    prose = " ".join(text.split())  # (long lines wrap)
    for shape in gpu_check.DRY_SHAPES:
        assert f"== {shape.name}: {shape.describe()}" in prose
    for label in {label for shape in gpu_check.DRY_SHAPES for label, _ in shape.settings}:
        having = sum(label in dict(shape.settings) for shape in gpu_check.DRY_SHAPES)
        assert text.count(f"   {label} ") == having, label  # a line per shape that runs it
    for line in ("A/A floor (full against full, same rounds)", "decode loop vs bare forward: bench loop",
                 "determinism self-check and timed repeats: ok", "non-finite values at real positions 0, at padding 0",
                 "CUDA determinism settings: ", gpu_check.AGREEMENT_NOTE):  # fmt: skip
        assert line in prose, line
    result = json.loads((out / "gpu_check.json").read_text())
    assert result["dry_run"] and "cudnn.deterministic" in result["determinism_settings"]
    assert [s["shape"]["name"] for s in result["shapes"]] == [s.name for s in gpu_check.DRY_SHAPES]
    for shape in result["shapes"]:
        rows = {r["label"]: r for r in shape["settings"]}
        assert [r["status"] for r in rows.values()] == ["ok"] * len(gpu_check.Shape(**shape["shape"]).settings)
        assert shape["sdpa"]["padded_positions"] > 0 and shape["sdpa"]["rows_equal_alone"] == shape["sdpa"]["rows"]
        for r in rows.values():
            assert r["ms_per_token"] > 0 and r["speedup_wall"] > 0
        if shape["shape"]["family"] == "falcon-h1":  # the hybrid's state-space path alone drafts, losslessly
            free = rows["self-spec, attention-free"]
            assert free["skip"] == "attention-free" and free["skip_ratio"] == 0.5 and free["agreement"] == 1.0
            n = free["draft_len"]
            assert len(free["acceptance_by_position"]) == n and len(free["accepted_length_hist"]) == n + 1
            assert shape["sublayer_ms"]["mixer"] > 0 and "its state-space mixer" in prose
            continue
        half = shape["shape"]["layers"] // 2
        assert (
            rows["fixed L/2, kv propagate"]["exit_layer"] == half and rows["fixed L/2, kv full"]["kv_policy"] == "full"
        )
        assert rows["self-speculation L/2"]["mode"] == "self_speculative" and rows["full (A/A)"]["speedup_model"] == 1.0
        for r in rows.values():
            if r["mode"] == "early_exit":
                assert r["speedup_model"] > 0


def test_without_a_gpu_it_says_so(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    res = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
        timeout=120,
    )
    assert res.returncode == 2 and "error: no CUDA device" in res.stdout
    bad = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--fast"], capture_output=True, text=True)
    assert (
        bad.returncode == 2 and bad.stderr.strip() == "error: --fast: unknown argument (allowed: --dry-run, --out DIR)"
    )


def test_a_shape_that_cannot_run_is_one_line_and_the_next_still_runs(tmp_path, monkeypatch, capsys):
    bad = gpu_check.Shape("odd-shape", 2, 64, 3, 3, 16, 128, 512, True, "float32", 10_000.0)  # 64 % 3 heads
    good = gpu_check.DRY_SHAPES[0]
    monkeypatch.setattr(gpu_check, "DRY_SHAPES", (bad, good))
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--dry-run", "--out", str(tmp_path)])
    assert gpu_check.main() == 1
    out, err = capsys.readouterr()
    assert (
        "== odd-shape: failed (" in out
        and "not a multiple of the number of attention heads" in " ".join(out.split())
        and f"== {good.name}: {good.describe()}" in " ".join(out.split())
    )
    assert "error: failed: odd-shape" in err
    shapes = json.loads((tmp_path / "gpu_check.json").read_text())["shapes"]
    assert [s["shape"]["name"] for s in shapes] == [good.name]


def test_each_shape_keys_its_own_cost_model(tmp_path):
    """The cost cache keys a model by its content: the dry run's SmolLM2-shaped and Falcon-H1-shaped models share a
    depth, a dtype and a seed, and once shared a key, so the hybrid could be priced with the other's costs (no
    mixer's) whenever the cached step time passed the cache's check: the dry run's mixer figure was then missing."""
    from sweep.bench import costs_cache

    dense, hybrid = (s for s in gpu_check.DRY_SHAPES if s.name in ("tiny-smollm2-shape", "tiny-falcon-h1-shape"))
    assert (dense.layers, dense.dtype) == (hybrid.layers, hybrid.dtype)
    a, b = gpu_check.build_model(dense, "cpu", 0), gpu_check.build_model(hybrid, "cpu", 0)
    assert a.content_hash != b.content_hash
    assert costs_cache.path_for(tmp_path, a, 8) != costs_cache.path_for(tmp_path, b, 8)
    again = gpu_check.build_model(dense, "cpu", 0)  # the same shape and seed: the same model, its costs kept
    assert again.content_hash == a.content_hash
    assert gpu_check.build_model(dense, "cpu", 1).content_hash != a.content_hash


def test_a_warning_of_the_bench_is_in_the_report_within_its_width(tmp_path, monkeypatch):
    """The dry run at 7f508c1 measured a cost model that did not hold together and its warning, through logging's
    last resort, was a 269-column line of the report. In the check, the bench's warnings go to the report's stream,
    in its width; once the check ends, the stream hears no more of them."""
    import io
    import logging

    from conftest import compose
    from helpers.contract import chat_prompts
    from sweep.bench import costs_cache
    from sweep.bench.costs import cost_model
    from sweep.models import load_model

    monkeypatch.setenv("SWEEP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(costs_cache, "PART", 1e-9)  # no measurement fits its step: measured twice, not kept
    cfg = compose("model=tiny-llama", "seed=978")  # a model this process has not loaded (its costs not in memory)
    lm = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype, seed=cfg.seed)
    stream = io.StringIO()
    with gpu_check.warnings_in_report(stream):
        costs = cost_model(lm, chat_prompts(lm, 1)[0].input_ids)
    logging.getLogger("sweep.bench.costs_cache").warning("after the check")
    text = stream.getvalue()
    prose = " ".join(text.split())
    assert costs.source == "unsteady" and prose.startswith("warning: cost model cache ")
    assert "not kept for the machine" in prose and "after the check" not in text
    assert len(text.splitlines()) > 1 and max(len(line) for line in text.splitlines()) <= 120
