"""Every input is read as data (issue 46): a file a user names (a published skip set, a prompt set) or anyone could
plant in a shared root (a sweep's definition, a claim, a cache entry) is read only when it is a regular file of a
capped size, and its JSON only to a bounded depth: a FIFO, /dev/zero, a directory, JSON nested 100,000 deep or a
JSON list where an object belongs are one line (rc 2), never a hang, a MemoryError or a RecursionError. And an
error quotes what it names whole: control characters in a value are escaped, whatever their source."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import compose, run_cli
from sweep.errors import ConfigError

pytestmark = pytest.mark.faults

DEEP = "[" * 100_000 + "]" * 100_000
BENCH = ("model=tiny-llama", "prompts.n=1", "bench.gen_tokens=4", "bench.repeats=1", "bench.warmup=0")
SKIP = ("model=tiny-llama", "gate=skip", "bench.mode=self_speculative")


def plant(tmp_path, what: str):
    """A path that holds ``what``: a FIFO, /dev/zero, a directory, JSON nested 100,000 deep, a file over the cap."""
    from sweep.userfiles import CAP

    path = tmp_path / f"planted-{what}.json"
    if what == "fifo":
        os.mkfifo(path)
    elif what == "dev-zero":
        return "/dev/zero"
    elif what == "directory":
        path.mkdir()
    elif what == "deep":
        path.write_text(DEEP)
    elif what == "huge":
        path.write_text('{"attention": [' + " " * CAP + "1]}")
    return str(path)


PLANTS = ["fifo", "dev-zero", "directory", "deep", "huge"]
SAID = {
    "fifo": "a FIFO, not a regular file",
    "dev-zero": "a character device, not a regular file",
    "directory": "a directory, not a regular file",
    "deep": "JSON nested more than 32 deep",
    "huge": "over the cap of 1048576 bytes",
}


@pytest.mark.parametrize("what", PLANTS)
def test_a_published_skip_set_is_read_only_as_a_bounded_regular_file(tmp_path, what):
    """In a new process with a deadline only a hang reaches: before, a FIFO hung validation with no output,
    /dev/zero took all the memory it could (MemoryError), the deep JSON raised RecursionError."""
    path = plant(tmp_path, what)
    done = run_cli("bench", *SKIP, f"gate.skip=file:{path}", f"results.root={tmp_path / 'r'}", timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"error: gate.skip=file:{path}: cannot read a JSON skip set (") and SAID[what] in line
    assert not (tmp_path / "r").exists()


def test_a_published_skip_set_in_a_regular_file_still_reads(tmp_path):
    (tmp_path / "set.json").write_text('{"attention": [0, 2], "mlp": [1]}')
    assert compose(*SKIP, f"gate.skip=file:{tmp_path / 'set.json'}").gate.skip == "a1+m2+a3"


@pytest.mark.parametrize("what", ["fifo", "directory", "deep", "list", "huge"])
def test_a_sweep_definition_that_is_not_one_is_one_line(tmp_path, what):
    """Before: `[]` gave "unexpected AttributeError", 200,000 deep a RecursionError."""
    from sweep.orchestrate.plan import DEFINITION, plan_sweep

    args = [*BENCH, "search=margin-grid", f"results.root={tmp_path}", "sweep.name=s1", "resume=true"]
    where = tmp_path / "ray" / "s1"
    where.mkdir(parents=True)
    if what == "list":
        (where / DEFINITION).write_text("[]")
    elif what == "deep":
        (where / DEFINITION).write_text("[" * 200_000 + "]" * 200_000)
    else:
        os.replace(plant(tmp_path, what), where / DEFINITION)
    with pytest.raises(ConfigError) as info:
        plan_sweep(compose(*args), args)
    said = str(info.value)
    assert said.startswith(f"sweep.name=s1: its definition {where / DEFINITION} cannot be read (") and "\n" not in said
    why = {"list": "a JSON list, not an object", "deep": "JSON nested more than 32 deep"}.get(what) or SAID[what]
    assert why in said


def test_a_sweep_definition_in_a_fresh_process_never_hangs(tmp_path):
    from sweep.orchestrate.plan import DEFINITION

    where = tmp_path / "ray" / "s1"
    where.mkdir(parents=True)
    os.mkfifo(where / DEFINITION)
    args = ["run", *BENCH, "search=margin-grid", f"results.root={tmp_path}", "sweep.name=s1", "resume=true"]
    done = run_cli(*args, timeout=120)
    assert done.returncode == 2 and "a FIFO, not a regular file" in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("what", ["fifo", "dev-zero", "directory"])
def test_a_prompt_set_is_read_only_as_a_regular_file(tmp_path, what):
    path = plant(tmp_path, what)
    done = run_cli("bench", *BENCH, "prompts=jsonl", f"prompts.path={path}", timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: prompts.path=") and "not a regular file" in line, line


def test_a_prompt_line_nested_deep_is_one_line(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"id": 1, "prompt": "hi"}\n' + DEEP + "\n")
    done = run_cli("bench", *BENCH, "prompts=jsonl", f"prompts.path={tmp_path / 'p.jsonl'}", timeout=120)
    assert done.returncode == 2 and "line 2: not valid JSON (JSON nested more than 32 deep)" in done.stderr


def test_read_capped_refuses_without_opening(tmp_path):
    """The read itself: what a stat shows is not a regular file is never opened (a FIFO with no writer would block
    an open for reading forever: here it returns at once), and a file past the cap is never read whole."""
    from sweep.userfiles import NotData, NotRegular, read_capped, read_json

    os.mkfifo(tmp_path / "f")
    with pytest.raises(NotRegular, match="a FIFO, not a regular file"):
        read_capped(tmp_path / "f")
    with pytest.raises(NotRegular, match="a character device"):
        read_capped("/dev/zero")
    (tmp_path / "big").write_bytes(b"x" * 101)
    with pytest.raises(NotData, match="101 bytes, over the cap of 100 bytes"):
        read_capped(tmp_path / "big", 100)
    assert read_capped(tmp_path / "big", 101) == b"x" * 101
    (tmp_path / "deep.json").write_text(DEEP)
    with pytest.raises(NotData, match="nested more than 32 deep"):
        read_json(tmp_path / "deep.json")
    (tmp_path / "strings.json").write_text('{"a": "' + "[" * 60 + '\\"{"}')
    assert read_json(tmp_path / "strings.json") == {"a": "[" * 60 + '"{'}  # brackets inside a string do not nest


# ------------------------------------------------------------------ control characters in messages


@pytest.mark.parametrize(
    ("override", "shown"),
    [
        ("run_id='a\nb'", "error: run_id=a\\nb: must be 1-128 letters"),
        ("sweep.name='a\tb'", "error: sweep.name=a\\tb: must be 1-128 letters"),
        ("prompts.name='chat\nx'", "error: prompts.name=chat\\nx: must be one of chat"),
    ],
)
def test_a_control_character_in_a_value_is_escaped_not_cutting_the_line(tmp_path, override, shown):
    """Before: "error: run_id=a" and no more."""
    done = run_cli("bench", *BENCH, override, f"results.root={tmp_path}", timeout=120)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(shown), line


def test_a_skip_set_with_a_newline_shows_whole(tmp_path):
    done = run_cli("bench", *SKIP, "gate.skip='a1\nm2'", f"results.root={tmp_path}", timeout=120)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: gate.skip=a1\\nm2: must be a skip set"), line


def test_every_error_escapes_what_it_quotes():
    """One place (the error classes), whatever builds the message: a value from a file or the system too."""
    from sweep.errors import InputError, SweepError, escape_controls

    for cls in (SweepError, ConfigError, InputError):
        assert str(cls("key=a\nb\x00c\u2028d: e")) == "key=a\\nb\\x00c\\u2028d: e"
    assert escape_controls("naïve 模型 ok") == "naïve 模型 ok"


def test_an_unexpected_error_line_is_escaped_too(tmp_path):
    code = (
        "import sys; from sweep.cli import commands\n"
        "commands.COMMANDS['schema'] = lambda o: (_ for _ in ()).throw(RuntimeError('a\\x1b[31mb'))\n"
        "sys.exit(commands.main(['schema']))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "SWEEP_DEBUG"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1 and "unexpected RuntimeError" in done.stderr and "a\\x1b[31mb" in done.stderr


def _model_dir(tmp_path):
    from transformers import LlamaConfig

    where = tmp_path / "model"
    config = LlamaConfig(
        num_hidden_layers=2, hidden_size=16, num_attention_heads=2, num_key_value_heads=2, intermediate_size=32
    )
    config.save_pretrained(where)
    return where


def test_a_fifo_among_a_models_files_is_refused_without_opening_it(tmp_path):
    """Before: the model's fingerprint opened it and waited for a writer forever."""
    where = _model_dir(tmp_path)
    os.mkfifo(where / "model.safetensors")
    done = run_cli("bench", "model=hf", f"model.path={where}", f"results.root={tmp_path / 'r'}", timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: model.path: {where / 'model.safetensors'} is a FIFO, not a regular file (a model's files are read)"
    )


def test_a_safetensors_header_nested_deep_is_one_line(tmp_path):
    """Before: "unexpected RecursionError" from the header check."""
    import struct

    where = _model_dir(tmp_path)
    header = ('{"t": {"x": ' + "[" * 5000 + "]" * 5000 + "}}").encode()
    (where / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    done = run_cli("bench", "model=hf", f"model.path={where}", f"results.root={tmp_path / 'r'}", timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    [line] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert "is truncated or corrupt (its header is JSON nested more than 32 deep: not safetensors)" in line, line
