"""Bad input across every command, as a hostile-but-fair user types it.

For each: a non-zero exit, exactly one `error:` line that names the key or file, no
traceback, and nothing written (neither results.root nor the working directory gains a
file). The CLI runs in this process (``sweep.cli.commands.main``); jobs/submit.py in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, run_cli
from sweep.cli.commands import main

TINY = ["model=tiny-llama", "prompts.n=2", "bench.gen_tokens=4", "bench.repeats=1", "bench.warmup=0"]

# (command line, a word the error line must contain); {root}: a fresh results.root, {file}: an existing plain file
CASES: list[tuple[list[str], str]] = [
    # profile
    (["profile", "model=nope"], "model=nope"),
    (["profile", *TINY, "prompts.n=0"], "prompts.n"),
    (["profile", *TINY, "profile.gen_tokens=0"], "profile.gen_tokens"),
    (["profile", *TINY, "prompts=jsonl"], "prompts.path"),
    (["profile", *TINY, "prompts=jsonl", "prompts.path={root}/missing.jsonl"], "missing.jsonl"),
    (["profile", *TINY, "dtype=float8"], "dtype"),
    (["profile", *TINY, "device=tpu"], "device"),
    (["profile", "model=hf"], "model.path"),
    (["profile", *TINY, "model.name=../x"], "model.name"),
    (["profile", *TINY, "run_id=.."], "run_id"),
    (["profile", *TINY, "run_id=.hidden"], "run_id"),
    (["profile", *TINY, "run_id=a/b"], "run_id"),
    (["profile", *TINY, "results.root={file}"], "results.root"),
    (["profile", *TINY, "results.root={file}/sub"], "results.root"),
    # bench
    (["bench", *TINY, "gate=saturation", "gate.eps=inf"], "gate.eps"),
    (["bench", *TINY, "gate=margin", "gate.theta=nan"], "gate.theta"),
    (["bench", *TINY, "gate=softmax", "gate.theta=1.5"], "gate.theta"),
    (["bench", *TINY, "gate=softmax", "gate.decay=inf"], "gate.decay"),
    (["bench", *TINY, "gate=saturation", "gate.theta=2"], "gate.theta"),
    (["bench", *TINY, "gate=bogus"], "gate=bogus"),
    (["bench", *TINY, "bench.repeats=0"], "bench.repeats"),
    (["bench", *TINY, "bench.batch_size=4"], "bench.batch_size"),
    (["bench", *TINY, "bench.mode=self_speculative", "gate=saturation"], "bench.mode"),
    (["bench", *TINY, "gate.min_layer=0"], "gate.min_layer"),
    (["bench", *TINY, "bogus.key=1"], "bogus"),
    (["bench", *TINY, "gate=pca", "gate.k=99999"], "gate.k"),
    (["bench", *TINY, "gate=fixed", "gate.exit_layer=99"], "gate.exit_layer"),
    (["bench", *TINY, "results.root={file}"], "results.root"),
    # run
    (["run", *TINY, "search.name=../../escape"], "search.name"),
    (["run", *TINY, "sweep.name=.."], "sweep.name"),
    (["run", *TINY, "sweep.name=.hidden"], "sweep.name"),
    (["run", *TINY, "search=nope"], "search=nope"),
    (
        ["run", *TINY, "search=optuna-mo", "search.spaces=[{gate: softmax, gate.theta: 'interval(0.1, 1.5)'}]"],
        "gate.theta",
    ),
    (["run", *TINY, "sweep.storage=s3://bucket/x"], "sweep.storage"),
    (["run", *TINY, "resume=true", "sweep.name=nothing-here"], "sweep.name"),
    (["run", *TINY, "cluster.auth=maybe"], "cluster.auth"),
    (["run", *TINY, "search=optuna-mo", "search.n_trials=0"], "search.n_trials"),
    (["run", *TINY, "results.root={file}"], "results.root"),
    (["run", *TINY, "sweep.storage={file}/ray"], "sweep.storage"),
    # a prompt set is read before Ray starts (as bench reads it before its model loads), not by each trial
    (["run", *TINY, "prompts=jsonl", "prompts.path={root}/missing.jsonl"], "missing.jsonl"),
    (["run", *TINY, "search.spaces=[{gate: margin, prompts: jsonl, prompts.path: '{file}'}]"], "prompts.path"),
    # a sub-space varies what a setting is; the sweep's own keys there were dropped (or wrote claims elsewhere)
    (["run", *TINY, "search.spaces=[{gate: margin, results.root: '{root}/other'}]"], "search.spaces[0].results.root"),
    (["run", *TINY, "search.spaces=[{gate: margin, device: cuda}]"], "search.spaces[0].device"),
    # a key of the command line that a skipset search draws with each set would change nothing
    (["run", *TINY, "search=skipset-optuna", "search.draft_lens=[1,2]", "bench.draft_len=3"], "search.draft_lens"),
    # analyze
    (["analyze", "results.root={root}"], "results.root"),
    (["analyze", "results.root={root}", "analysis.targets=[1.5]"], "analysis.targets"),
    (["analyze", "results.root={root}", "analysis.n_boot=1"], "analysis.n_boot"),
    (["analyze", "results.root={file}"], "results.root"),
    # a report inside a table's directory broke every reader of that table
    (["analyze", "results.root={root}", "analysis.out={root}/trials"], "inside the results' trials/ directory"),
    (["analyze", "results.root={root}", "analysis.out={root}/pareto/sub"], "inside the results' pareto/ directory"),
    # calibrate
    (["calibrate", *TINY, "gate=saturation", "calibrate.delta=1"], "calibrate.delta"),
    (["calibrate", *TINY, "gate=saturation", "calibrate.grid='choice(a,b)'"], "calibrate.grid"),
    (["calibrate", *TINY, "gate=saturation", "calibrate.grid='choice(0.1,inf)'"], "calibrate.grid"),
    (["calibrate", *TINY, "gate=full"], "gate=full"),
    (["calibrate", *TINY, "gate=saturation", "calibrate.epsilon=0"], "calibrate.epsilon"),
    (["calibrate", *TINY, "gate=saturation", "calibrate.split=1"], "calibrate.split"),
    # issue 25: inputs that ended in "unexpected ..." or blamed the wrong thing
    (["bench", *TINY, "seed=18446744073709551615"], "seed=18446744073709551615"),
    (["profile", *TINY, "seed=9223372036854775808"], "seed=9223372036854775808"),
    (["run", *TINY, "search=optuna-mo", "search.seed=4294967296"], "search.seed"),
    (["profile", *TINY, "profile.topk=1000"], "profile.topk=1000"),
    (["profile", *TINY, "profile.topk=261"], "profile.topk=261"),
    (["bench", *TINY, "results.root={root}/" + "x" * 300], "results.root"),
    (["profile", *TINY, "results.root={root}/" + "x" * 256 + "/y"], "results.root"),
    (["run", *TINY, "sweep.storage={root}/" + "s" * 300], "sweep.storage"),
    (["analyze", "results.root={root}", "analysis.out={root}/" + "o" * 300], "analysis.out"),
    (["fit", "model=tiny-llama", "prompts.n=2", "results.root={root}", "fit.out={root}/" + "f" * 300], "fit.out"),
    (["bench", *TINY, "results.root={root}/" + "/".join(["d" * 200] * 20)], "results.root"),
    (["bench", *TINY, "bench.gen_tokens=4096"], "bench.gen_tokens=4096"),
    (["bench", *TINY, "bench.gen_tokens=4095"], "bench.gen_tokens=4095"),
    (["profile", *TINY, "profile.gen_tokens=4096"], "profile.gen_tokens=4096"),
    (["fit", "model=tiny-llama", "prompts.n=2", "fit.gen_tokens=4096"], "fit.gen_tokens=4096"),
    (["calibrate", *TINY, "gate=margin", "prompts.n=4", "bench.gen_tokens=4096"], "bench.gen_tokens=4096"),
    # config, schema, the command itself
    (["config", "gate.nope=1"], "gate.nope"),
    (["config", "gate=saturation", "gate.eps=nan"], "gate.eps"),
    # errors name the override as typed: an interpolation's key, a gate key without the tool's '++', the one override
    # that does not parse
    (["config", "gate=margin", "gate.theta=${oc.env:SWEEP_ABUSE_UNSET_X}"], "error: gate.theta: cannot resolve"),
    (["config", "gate=saturation", "gate.eps=choice(1,2)"], "error: gate.eps=choice(1,2): a sweep expression"),
    (["config", "gate=saturation", "gate.eps=("], "cannot parse the overrides: gate.eps=( "),
    (["config", "analysis.out=/tmp/x/model=tiny"], "cannot parse the overrides: analysis.out=/tmp/x/model=tiny "),
    # keys nothing reads without another key: refused, not run as if given (prompts.path changed only the trial id)
    (["bench", *TINY, "prompts.path={file}"], "read by prompts=jsonl only"),
    (["bench", *TINY, "eval.samples=2"], "eval.samples: read only with eval.task"),
    (["calibrate", *TINY, "gate=margin", "calibrate.heldout_n=5"], "calibrate.heldout_n: read only with"),
    # a config group's value is one of its options; an override has a key of this tool's config
    (["config", "model=null"], "model=null: one option of conf/model/"),
    (["config", "gate=3"], "gate=3: one option of conf/gate/"),
    (["config", "gate=[full,margin]"], "gate=[full,margin]: one option of conf/gate/"),  # Hydra merged the two
    (["bench", *TINY, "=1"], "=1: not a config key=value"),
    (["config", "gate@x=margin"], "gate@x=margin"),
    (["config", "hydra.run.dir=x"], "hydra.run.dir=x"),
    (["schema", "extra=1"], "schema"),
    (["nosuchcommand"], "nosuchcommand"),
]


@pytest.fixture()
def places(tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    plain = tmp_path / "plain-file"
    plain.write_text("not a directory")
    monkeypatch.delenv("SWEEP_DEBUG", raising=False)
    return {"root": str(tmp_path / "results"), "file": str(plain), "cwd": cwd, "tmp": tmp_path}


def _one_error_line(err: str, word: str) -> str:
    assert "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    assert word in errors[0], f"{word!r} not named in: {errors[0]}"
    return errors[0]


def _nothing_written(places) -> None:
    assert not Path(places["root"]).exists(), "results.root was created"
    assert not any(places["cwd"].iterdir()), "files appeared in the working directory"
    assert sorted(p.name for p in places["tmp"].iterdir()) == ["cwd", "plain-file"]
    assert Path(places["file"]).read_text() == "not a directory"


def test_there_are_at_least_40_bad_inputs():
    assert len(CASES) >= 40, len(CASES)


@pytest.mark.parametrize("argv, word", CASES, ids=[" ".join(c[0][:1] + c[0][-1:]) for c in CASES])
def test_bad_input_is_one_line_nonzero_and_writes_nothing(argv, word, places, capsys):
    if "results.root=" not in " ".join(argv) and argv[0] not in ("config", "schema", "nosuchcommand"):
        argv = [*argv, "results.root={root}"]
    argv = [a.replace("{root}", places["root"]).replace("{file}", places["file"]) for a in argv]
    code = main(argv)
    err = capsys.readouterr().err
    assert code != 0, err
    line = _one_error_line(err, word)
    _nothing_written(places)
    print(f"rc {code}: {line}")


SUBMIT_CASES = [
    (["--", "model=tiny-llama"], "results.root"),
    (["--", "results.root=relative/path"], "results.root"),
    (["--", "results.root=/shared/r", "gate.eps=inf", "gate=saturation"], "gate.eps"),
    (["--address", "http://127.0.0.1:9", "--", "results.root=/shared/r", "search.name=../x"], "search.name"),
    (["--", "results.root=/shared/r", "model=null"], "model=null"),  # a traceback before
    # a sub-space's bad value: refused here, not by the job on the cluster
    (["--", "results.root=/shared/r", "search.spaces=[{gate: saturation, bench.gen_tokens: 0}]"], "bench.gen_tokens=0"),
]


@pytest.mark.parametrize("argv, word", SUBMIT_CASES)
def test_bad_submissions_are_one_line_and_contact_nothing(argv, word, places):
    env = {k: v for k, v in os.environ.items() if k != "SWEEP_DEBUG"}
    res = subprocess.run(
        [sys.executable, str(ROOT / "jobs" / "submit.py"), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=places["cwd"],
        env=env,
    )
    assert res.returncode != 0, res.stderr
    _one_error_line(res.stderr, word)
    assert not any(places["cwd"].iterdir())


# ---------------------------------------------------------------- issue 25: the environment, and stdout going away


def _conf_copy(tmp_path: Path, edit: dict[str, str]) -> Path:
    import shutil

    conf = tmp_path / "conf-copy"
    shutil.copytree(ROOT / "conf", conf)
    for name, text in edit.items():
        with open(conf / name, "a") as f:
            f.write(text)
    return conf


ENV_CASES = [
    ({"config.yaml": "broken: [unclosed\n"}, ["config"], "config.yaml:"),
    ({"gate/saturation.yaml": "eps: {a: 1\n"}, ["profile", *TINY, "gate=saturation"], "gate/saturation.yaml:"),
    ({"model/tiny-llama.yaml": "\t tab: x\n"}, ["bench", *TINY], "model/tiny-llama.yaml:"),
    ({"search/optuna-mo.yaml": "- - : ]\n"}, ["run", *TINY, "search=optuna-mo"], "search/optuna-mo.yaml:"),
]


@pytest.mark.parametrize("edit, argv, word", ENV_CASES, ids=[c[2] for c in ENV_CASES])
def test_a_conf_directory_that_is_not_yaml_is_one_line_naming_the_file(edit, argv, word, places, capsys, monkeypatch):
    monkeypatch.setenv("SWEEP_CONFIG_DIR", str(_conf_copy(places["tmp"] / "confs", edit)))
    code = main([*argv, f"results.root={places['root']}"] if argv[0] != "config" else argv)
    err = capsys.readouterr().err
    assert code == 2, err
    line = _one_error_line(err, word)
    assert line.startswith("error: SWEEP_CONFIG_DIR=") and "not valid YAML" in line
    assert not Path(places["root"]).exists() and not any(places["cwd"].iterdir())


def test_a_relative_conf_directory_is_used_as_given(places, capsys, monkeypatch):
    import shutil

    shutil.copytree(ROOT / "conf", places["cwd"] / "myconf")
    monkeypatch.setenv("SWEEP_CONFIG_DIR", "myconf")  # relative to the working directory
    assert main(["config", "gate=saturation"]) == 0
    assert "name: saturation" in capsys.readouterr().out


def test_a_state_directory_under_a_file_is_one_line_before_any_work(places):
    """In a process of its own, as a user runs it: in this test process another test's Ray may be running already,
    and a sweep there joins it and never reads the state directory."""
    env = {"SWEEP_STATE_DIR": f"{places['file']}/state"}
    done = run_cli("run", *TINY, f"results.root={places['root']}", cwd=places["cwd"], env=env)
    assert done.returncode == 2, done.stderr
    line = _one_error_line(done.stderr, "SWEEP_STATE_DIR")
    assert f"lies under {places['file']}, which is a file" in line
    _nothing_written(places)


@pytest.mark.parametrize("argv", [["schema"], ["config"], ["config", "gate=margin"], ["--help"], ["run", "--help"]])
def test_stdout_closed_early_is_a_quiet_exit(argv, places):
    """`sweep schema | head -1`: the reader leaves; no traceback, no error line (128 + SIGPIPE, as cat does)."""
    env = {k: v for k, v in os.environ.items() if k != "SWEEP_DEBUG"}
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("sweep")), *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=places["cwd"],
        env=env,
    )
    proc.stdout.close()  # before the command writes a byte
    err = proc.stderr.read().decode()
    code = proc.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipe" not in err and "error:" not in err, err
    assert code in (0, 141), (code, err)
