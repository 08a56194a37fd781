"""`sweep --help`, `sweep <command> --help` and Hydra's habits (issue 13, item 9): help prints
each command's main keys with their values in the composed config (conf/, the one place
defaults live), Hydra's flags and comma lists get one line saying what to use instead."""

from __future__ import annotations

import re
import shutil

import pytest
import yaml

from conftest import ROOT, run_cli
from sweep.cli.commands import COMMANDS, main
from sweep.cli.help import HELP, USAGE
from sweep.config import compose, compose_dict


def _one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    return lines[0]


def _value(data: dict, key: str) -> str:
    for part in key.split("."):
        data = data[part]
    text = yaml.safe_dump(data, default_flow_style=True, width=10**6).strip().removesuffix("\n...").strip()
    return "null" if data is None else text


@pytest.mark.parametrize("argv", [[], ["--help"], ["-h"], ["help"]])
def test_top_level_help(capsys, argv):
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out == USAGE and all(f"  {c}" in out for c in COMMANDS) and "sweep <command> --help" in out


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("form", ["--help", "-h", "help"])
def test_every_command_has_help_with_its_keys_defaults_and_examples(capsys, command, form):
    assert HELP.keys() == COMMANDS.keys()
    argv = ["help", command] if form == "help" else [command, form]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: sweep {command}") and "examples:\n  sweep " in out
    data = compose_dict([])
    for key in HELP[command].keys:  # each value as conf/ composes it, never a copy in code
        if key in ("model", "gate", "prompts", "search", "cluster", "experiment"):
            assert re.search(rf"^  {key}=\S+ +conf/{key}/: ", out, re.MULTILINE), key
        else:
            shown = _value(data, key)
            shown = shown if len(shown) <= 70 else shown[:67] + "..."
            assert f"  {key}={shown}" in out, key


def test_help_reads_the_defaults_from_conf(capsys, tmp_path, monkeypatch):
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    text = (conf / "config.yaml").read_text()
    (conf / "config.yaml").write_text(
        text.replace("  gen_tokens: 32   # greedy tokens", "  gen_tokens: 7   # greedy tokens")
    )
    monkeypatch.setenv("SWEEP_CONFIG_DIR", str(conf))
    assert main(["bench", "--help"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^  bench.gen_tokens=7 +greedy tokens per prompt", out, re.MULTILINE)


def test_help_shows_the_values_the_overrides_compose(capsys):
    assert main(["run", "search=screen", "model=tiny-llama", "--help"]) == 0
    out = capsys.readouterr().out
    assert "values from the composed config" in out
    assert re.search(r"^  search=screen ", out, re.MULTILINE) and "  search.kind=screen" in out
    assert re.search(r"^  model=tiny-llama ", out, re.MULTILINE)
    assert main(["bench", "gate=nope", "--help"]) == 0  # overrides that do not compose: the defaults, and why
    out = capsys.readouterr().out
    assert "(the overrides do not compose: gate=nope: unknown option" in out and "  gate=full " in out


def test_help_shows_the_chosen_gates_threshold_as_overridden(capsys):
    assert main(["bench", "gate=margin", "gate.theta=3", "--help"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^  gate=margin .*\n  gate.theta=3\n", out, re.MULTILINE)  # beside its gate, not the conf's 14
    assert main(["bench", "gate=pca", "--help"]) == 0  # every parameter the chosen gate has, as composed
    out = capsys.readouterr().out
    assert "\n  gate.eps=0.05\n  gate.k=64\n" in out and "gate.theta" not in out.split("gates (")[0]


def test_run_help_shows_the_chosen_search_kinds_own_keys(capsys):
    assert main(["run", "search=screen", "--help"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^  search.neighbours=1 +the knee's neighbours on each side", out, re.MULTILINE)
    assert main(["run", "search=skipset-random", "--help"]) == 0
    out = capsys.readouterr().out
    assert (
        re.search(r"^  search.sampler=random +tpe \| random$", out, re.MULTILINE) and "  search.closed_loop=8 " in out
    )
    assert main(["run", "search=optuna-mo", "--help"]) == 0  # another kind's keys are not its own
    out = capsys.readouterr().out.split("search kinds")[0]
    assert "search.sampler=tpe" in out and "search.neighbours" not in out and "search.closed_loop" not in out


def test_bench_help_lists_every_gate_with_its_conf_defaults(capsys):
    assert main(["help", "bench"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^  saturation +eps=0.1 min_depth=0.25 +exits when", out, re.MULTILINE)
    assert re.search(r"^  fixed +min_depth=0.5 +always exits", out, re.MULTILINE)


def test_help_of_an_unknown_command(capsys):
    assert main(["help", "nope"]) == 2
    assert _one_error_line(capsys).startswith("error: unknown command 'nope'")


def test_analyze_help_names_every_analysis_key(capsys):
    import dataclasses

    from conftest import compose

    assert main(["analyze", "--help"]) == 0
    out = capsys.readouterr().out
    keys = [f"analysis.{f.name}" for f in dataclasses.fields(compose().analysis)]
    assert [k for k in keys if f"  {k}=" not in out] == []


@pytest.mark.parametrize("command", ["schema", "families"])
def test_an_override_to_a_command_that_takes_none_is_bad_input(capsys, command):
    assert main([command, "foo=1"]) == 2  # exit code 2, as every other bad key or value
    assert _one_error_line(capsys) == f"error: sweep {command} takes no overrides (got foo=1): run it alone"


@pytest.mark.parametrize(
    "argv",
    [["run", "-m"], ["run", "--multirun", "search=screen"], ["-m", "run"], ["bench", "gate.eps=0.1", "-m"]],
)
def test_multirun_points_to_search(capsys, argv):
    assert main(argv) == 2
    line = _one_error_line(capsys)
    assert line == (
        "error: -m/--multirun: sweeps are `sweep run search=...` (a grid or Optuna over search.spaces); "
        "see `sweep run --help`"
    )


@pytest.mark.parametrize(
    "argv,flag,instead",
    [
        (["bench", "--cfg", "job"], "-c/--cfg", "`sweep config [key=value ...]` prints the composed config"),
        (["config", "--cfg"], "-c/--cfg", "`sweep config"),
        (["--cfg", "job"], "-c/--cfg", "`sweep config"),
        (["run", "-c", "all"], "-c/--cfg", "`sweep config"),
        (["config", "--resolve"], "--resolve", "`sweep config"),
        (["config", "--info"], "-i/--info", "`sweep config"),
        (["config", "-p", "gate"], "-p/--package", "`sweep config"),
        (["run", "--config-dir", "/x"], "-cd/--config-dir", "SWEEP_CONFIG_DIR=DIR"),
        (["run", "--config-dir=/x"], "-cd/--config-dir", "SWEEP_CONFIG_DIR=DIR"),
        (["run", "-cd", "/x"], "-cd/--config-dir", "SWEEP_CONFIG_DIR=DIR"),
        (["run", "--config-path", "/x"], "--config-path", "SWEEP_CONFIG_DIR=DIR"),
        (["bench", "--config-name", "other"], "-cn/--config-name", "experiment=NAME"),
        (["bench", "--run"], "-r/--run", "sweeps are `sweep run search=...`"),
        (["bench", "--hydra-help"], "--hydra-help", "`sweep <command> --help`"),
        (["bench", "--version"], "--version", "pip show sweep"),
        (["bench", "--shell-completion", "install=bash"], "-sc/--shell-completion", "`sweep --help`"),
        (["bench", "-x"], "-x", "not a flag of sweep; its only flags are --quiet/-q and --help/-h, every setting"),
        (["--foo=1"], "--foo", "every setting is a key=value override (Hydra's syntax); see `sweep --help`"),
        (["run", "experiment=main", "--quite"], "--quite", "not a flag of sweep; did you mean --quiet? its only"),
    ],
)
def test_hydra_flags_get_one_line_saying_what_to_use(capsys, argv, flag, instead):
    assert main(argv) == 2
    line = _one_error_line(capsys)
    assert line.startswith(f"error: {flag}: ") and instead in line, line


@pytest.mark.parametrize(
    "argv,space",
    [
        (["bench", "gate.eps=0.1,0.2"], "{gate: saturation, gate.eps: 'choice(0.1,0.2)'}"),
        (["bench", "gate=margin", "gate.theta=1,2"], "{gate: margin, gate.theta: 'choice(1,2)'}"),
        (["bench", "gate.q=0.5,1.0"], "{gate: conformal, gate.q: 'choice(0.5,1.0)'}"),
        (["run", "gate=saturation,margin"], "{gate: 'choice(saturation,margin)'}"),
        (["run", "bench.batch_size=1,4"], "{bench.batch_size: 'choice(1,4)'}"),
        (["config", "gate.min_depth=0.25,0.5"], "{gate: saturation, gate.min_depth: 'choice(0.25,0.5)'}"),
    ],
)
def test_a_comma_list_points_to_search_with_an_example_that_works(capsys, argv, space):
    assert main(argv) == 2
    line = _one_error_line(capsys)
    key = argv[-1].split("=", 1)[0]
    assert line.startswith(f"error: {argv[-1]}: a comma list is a sweep; sweeps are `sweep run search=...`")
    assert f'sweep run "search.spaces=[{space}]"' in line and "search=saturation-grid" in line
    example = re.search(r'sweep run "([^"]+)"', line).group(1)
    assert compose([example]).search.spaces  # the example is a valid sweep
    if "." in key:
        assert line.endswith(f"a list value is written {key}=[{argv[-1].split('=', 1)[1]}]")


def test_the_installed_script_prints_help_and_refuses_flags():
    out = run_cli("run", "--help", timeout=120)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert out.stdout.startswith("usage: sweep run") and "search=saturation-grid" in out.stdout
    refused = run_cli("run", "-m", "search=screen", timeout=120)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.strip().startswith("error: -m/--multirun: ") and refused.stderr.count("\n") == 1
