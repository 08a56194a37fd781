"""The report's learned-readout curves: ``lens_curves`` against the raw trace rows, and the
`sweep analyze` section (table and figure) that shows them only for traces taken with readouts."""

from __future__ import annotations

from collections import defaultdict

import polars as pl
import pytest

from sweep.analysis import lens_curves, load_profiles
from sweep.cli.commands import main
from sweep.report.sections import _lens_table

GEN = 4  # profile.gen_tokens: the last prefill position and 3 decode positions per prompt
HEADING = "## Learned readouts: tuned lens vs logit lens, tiny-llama"


def profile(root, *overrides: str) -> None:
    args = ["profile", "model=tiny-llama", "prompts=chat", f"profile.gen_tokens={GEN}", f"results.root={root}"]
    assert main([*args, *overrides]) == 0


@pytest.fixture(scope="module")
def lens_root(tmp_path_factory, llama_readouts):
    """A root with a trace of chat/3..4 taken with readouts fitted on chat/0..2, and a trace of
    chat/5 without readouts beside it (which the curves leave out)."""
    root = tmp_path_factory.mktemp("lens")
    profile(root, "prompts.start=3", "prompts.n=2", f"profile.readouts={llama_readouts}")
    profile(root, "prompts.start=5", "prompts.n=1")
    return root


def curves_by_hand(trace: pl.DataFrame) -> dict[int, dict]:
    """Per layer, from the rows one by one: positions at or after each prompt's last prefill
    position of traces with readouts; means of top1_match, tuned_match, kl_final, tuned_kl_final."""
    rows = [r for r in trace.iter_rows(named=True) if r["tuned_match"] is not None]
    last = defaultdict(lambda: -1)
    for r in rows:
        if r["phase"] == "prefill":
            key = (r["run_id"], r["prompt_id"])
            last[key] = max(last[key], r["position"])
    sums = defaultdict(lambda: defaultdict(float))
    for r in rows:
        if r["position"] >= last[(r["run_id"], r["prompt_id"])]:
            s = sums[r["layer"]]
            s["positions"] += 1
            s["logit_top1"] += r["top1_match"]
            s["tuned_top1"] += r["tuned_match"]
            s["kl_logit"] += r["kl_final"]
            s["kl_tuned"] += r["tuned_kl_final"]
    return {
        layer: {k: (v if k == "positions" else v / s["positions"]) for k, v in s.items()} for layer, s in sums.items()
    }


def test_lens_curves_are_the_raw_rows_means(lens_root, llama_readouts):
    trace = load_profiles(lens_root).collect()
    assert trace["run_id"].n_unique() == 2 and trace["tuned_match"].null_count() > 0  # one trace without readouts
    curves = lens_curves(trace)
    expected = curves_by_hand(trace)
    L = int(trace["num_layers"][0])
    assert curves["layer"].to_list() == list(range(1, L + 1)) == sorted(expected)
    ids = trace["readouts_id"].drop_nulls().unique().to_list()
    assert len(ids) == 1 and llama_readouts.stem.startswith(ids[0])
    for r in curves.iter_rows(named=True):
        e = expected[r["layer"]]
        assert (r["model"], r["readouts_id"], r["num_layers"], r["prompts"]) == ("tiny-llama", ids[0], L, 2)
        assert r["positions"] == e["positions"] == 2 * GEN  # decision positions of chat/3 and chat/4
        for name in ("logit_top1", "tuned_top1", "kl_logit", "kl_tuned"):
            assert r[name] == pytest.approx(e[name], rel=1e-6, abs=1e-9), (r["layer"], name)
    final = curves.filter(pl.col("layer") == L).row(0, named=True)
    assert final["tuned_top1"] == final["logit_top1"]  # the final layer's translator is the identity
    assert final["kl_tuned"] == pytest.approx(final["kl_logit"], abs=1e-5)
    below = curves.filter(pl.col("layer") < L)
    assert (below["kl_tuned"] != below["kl_logit"]).all()  # below L the tuned lens is a different readout
    assert lens_curves(trace.filter(pl.col("tuned_match").is_null())).height == 0


def test_the_report_shows_the_curves_of_traces_with_readouts(lens_root):
    assert main(["analyze", f"results.root={lens_root}"]) == 0
    report = (lens_root / "report" / "report.md").read_text()
    curves = lens_curves(load_profiles(lens_root))
    rid = curves["readouts_id"][0]
    name = f"lens_tiny-llama_{rid}.png"
    assert report.count(HEADING) == 1 and f"![{name}]({name})" in report
    assert (lens_root / "report" / name).stat().st_size > 10_000
    block = report.split(HEADING)[1].split("\n## ")[0]
    assert f"Readouts `{rid}`" in block and f"{2 * GEN} decision positions" in block and "evaluation prompts" in block
    table = [line for line in block.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert table == [
        f"| {r['layer']} | {r['logit_top1']:.3f} | {r['tuned_top1']:.3f} | {r['kl_logit']:.4g} | {r['kl_tuned']:.4g} |"
        for r in curves.iter_rows(named=True)
    ]  # every layer (L <= 32)
    assert report.index("## Profiles: EAS and oracle exits") < report.index(HEADING)


def test_no_readouts_no_section(tmp_path):
    profile(tmp_path, "prompts.start=3", "prompts.n=1")
    assert main(["analyze", f"results.root={tmp_path}"]) == 0
    report = (tmp_path / "report" / "report.md").read_text()
    assert "## Profiles: EAS and oracle exits" in report and "Learned readouts" not in report
    assert not list((tmp_path / "report").glob("lens_*.png"))


def test_a_deep_model_s_table_shows_a_stride_of_layers_and_the_last():
    L = 40
    curve = pl.DataFrame(
        {
            "layer": list(range(1, L + 1)),
            "num_layers": [L] * L,
            "positions": [8] * L,
            "prompts": [2] * L,
            "logit_top1": [i / L for i in range(1, L + 1)],
            "tuned_top1": [1.0] * L,
            "kl_logit": [1.0] * L,
            "kl_tuned": [None] * L,
        }
    )
    lines = _lens_table(curve, "abc")
    shown = [int(line.split("|")[1]) for line in lines if line.startswith("| ") and line[2].isdigit()]
    assert shown == [*range(1, L + 1, 2), L]
    assert "layers 1, 3, 5, ... and 40" in lines[0] and "| n/a |" in lines[-2]
