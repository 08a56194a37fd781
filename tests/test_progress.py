"""Progress on stderr (``sweep.progress``): live bars in a pseudo-terminal, a line per step in a pipe,
nothing under --quiet or CI; the time breakdown a bench ends with; workers' progress on the driver."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import compose, run_cli
from sweep import progress

SWEEP = str(Path(sys.executable).with_name("sweep"))
BENCH = ["bench", "model=tiny-llama", "gate=saturation", "gate.eps=0.3", "prompts.n=3", "bench.gen_tokens=6"]


def _env(**extra) -> dict:
    # CI="" overrides a CI runner's CI=true (run_cli starts from os.environ): these tests watch the display
    env = {k: v for k, v in os.environ.items() if k != "SWEEP_DEBUG"}
    return {**env, "CI": "", "OMP_NUM_THREADS": "1", **extra}


def _in_pty(args: list[str], timeout: float = 300) -> tuple[int, str, str]:
    """``sweep ARGS`` with stderr on a pseudo-terminal (as in a terminal; stdout piped): (rc, stdout, what the
    terminal received)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([SWEEP, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave, env=_env())
    os.close(slave)
    seen, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed its end
                break
            if not chunk:
                break
            seen += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    out = proc.stdout.read().decode()
    return proc.wait(timeout=60), out, seen.decode(errors="replace")


@pytest.mark.slow  # a program's start and its imports: 5 s or more of the fast tier (benchmarks/RESULTS.md)
def test_a_terminal_gets_live_bars_with_phase_count_elapsed_and_eta(tmp_path):
    rc, out, tty = _in_pty([*BENCH, f"results.root={tmp_path}"])
    assert rc == 0, tty[-3000:]
    assert "status: ok" in out
    # tqdm redraws in place ("\r"), each frame: phase, percentage, bar, done/total [elapsed<ETA, rate]
    frames = re.findall(r"\r(timed rounds|self-check): +(\d+)%\|[^|]*\| (\d+)/(\d+) \[(\d\d:\d\d)<(\d\d:\d\d|\?)", tty)
    assert frames, tty[-3000:]
    timed = [(int(done), int(total)) for phase, _, done, total, _, _ in frames if phase == "timed rounds"]
    assert timed[0] == (0, 9) and timed[-1][1] == 9  # 3 repeats x 3 prompts
    assert any(phase == "self-check" for phase, *_ in frames)
    assert "\rcost model: step rounds, probe saturation/hidden:" in tty
    # the bars leave no line behind: the log lines and the summary are all the terminal keeps
    kept = [line.rsplit("\r", 1)[-1] for line in tty.split("\n")]
    assert not any("timed rounds" in line for line in kept)


@pytest.mark.slow  # a program's start and its imports: 5 s or more of the fast tier (benchmarks/RESULTS.md)
def test_a_pipe_gets_a_line_per_step_at_most_one_a_minute(tmp_path):
    res = run_cli(*BENCH, f"results.root={tmp_path}", env=_env())
    assert res.returncode == 0, res.stderr[-3000:]
    assert "\r" not in res.stderr
    lines = res.stderr.splitlines()
    timed = [
        m.groups()
        for m in map(re.compile(r"^sweep: timed rounds: (\d+)/(\d+), (\S+) elapsed, ETA (\S+)$").match, lines)
        if m
    ]
    # steps come faster than one a minute: the first and the last
    assert [(int(a), int(b)) for a, b, _, _ in timed] == [(1, 9), (9, 9)]
    assert all(re.fullmatch(r"\d\d:\d\d", t) for _, _, e, eta in timed for t in (e, eta))
    assert any(line.startswith("sweep: self-check: 3/3, ") for line in lines)
    assert all(len(line) <= 120 for line in lines)  # log lines wrap too


@pytest.mark.slow
def test_quiet_and_ci_turn_the_progress_off(tmp_path):
    quiet = run_cli("--quiet", *BENCH, f"results.root={tmp_path}", env=_env())
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert not [line for line in quiet.stderr.splitlines() if line.startswith("sweep:") or "\r" in line]
    assert "status: ok" in quiet.stdout and quiet.stdout.splitlines()[-1].startswith("time ")  # results stay
    rc, out, tty = _in_pty(["--quiet", *BENCH, f"results.root={tmp_path}"])  # a terminal: no bars either
    assert rc == 0 and "status: ok" in out and "timed rounds" not in tty and "\r" not in tty.replace("\r\n", "")
    short = run_cli(*BENCH, "-q", f"results.root={tmp_path}", env=_env())  # -q, anywhere on the line
    assert short.returncode == 0 and "sweep:" not in short.stderr
    ci = run_cli(*BENCH, f"results.root={tmp_path}", env=_env(CI="true"))
    assert ci.returncode == 0, ci.stderr[-3000:]
    assert "timed rounds" not in ci.stderr and "self-check" not in ci.stderr  # no display
    assert "sweep: loaded tiny-llama" in ci.stderr  # the info lines stay


def test_line_mode_throttles_plain_steps_and_keeps_every_text(monkeypatch, caplog):
    """In a pipe: the first step, then one a LINE_EVERY_S, the last; a step with a text always has its line."""
    monkeypatch.setattr(progress, "LINE_EVERY_S", 3600.0)
    monkeypatch.delenv("CI", raising=False)
    caplog.set_level("INFO", logger="sweep.progress")
    with progress.session():  # pytest's stderr is no terminal: lines
        with progress.phase("demo", 5):
            for i in range(5):
                progress.step(text="the third" if i == 2 else None)
    lines = [r.getMessage() for r in caplog.records if r.name == "sweep.progress"]
    assert lines[0].startswith("demo: 1/5, ") and lines[-1].startswith("demo: 5/5, ")
    assert len(lines) == 3 and lines[1].startswith("[3/5] the third (") and "ETA" in lines[1]


def test_forwarded_events_replay_on_the_driver_with_their_source():
    posted: list[dict] = []
    with progress.forward(posted.append):
        with progress.phase("timed rounds", 4, part="timed rounds"):
            for _ in range(4):
                progress.step()
        with progress.timed("writing"):
            pass
    seen: list[progress.Event] = []
    with progress.breakdown() as times, progress.listen(seen.append):
        progress.replay(posted, "Tune trial t1")
    assert {e.source for e in seen} == {"Tune trial t1"}
    ends = [e for e in seen if e.kind == "end"]
    assert ends[0].phase == "timed rounds" and ends[0].done == 4 and ends[0].total == 4
    assert set(times.seconds) == {"timed rounds", "writing"} and times.sources == {"Tune trial t1"}
    assert "summed over 1 Tune trial or task" in times.line()


def test_the_breakdown_agrees_with_the_rows_own_seconds(tmp_path):
    """A bench's breakdown against the row's own clock (``bench_seconds``, ``setup_seconds``: another path):
    the parts measured between its start and its timed rounds lie inside its setup, the timed rounds inside the
    rest, and all of it inside the call (intervals nested in one clock: no tolerance to tune)."""
    from sweep.bench.command import run_bench

    cfg = compose("model=tiny-llama", "gate=margin", "gate.theta=1", "prompts.n=2", f"results.root={tmp_path}")
    t0 = time.perf_counter()
    with progress.breakdown() as times:
        _, row, _ = run_bench(cfg)
    wall = time.perf_counter() - t0
    parts = times.seconds
    assert set(parts) == {"load", "cost model", "warm-up and self-check", "timed rounds", "writing"}
    setup = parts["cost model"] + parts["warm-up and self-check"]
    assert 0 < setup <= row["setup_seconds"]
    rest = row["bench_seconds"] - row["setup_seconds"]
    assert 0 < parts["timed rounds"] <= rest
    assert sum(parts.values()) <= wall
    line = times.line()
    assert line.startswith("time ") and all(f"{p} " in line for p in parts) and len(line) <= 120


def test_gate_full_measures_no_probe():
    """gate=full has no probe: its cost model measures none (no probe phase, no probe cost), nor the K/V
    fill it never uses; a saturation gate on the same model does measure its own probe."""
    from sweep.bench.command import prepare
    from sweep.bench.protocol import run_trial
    from sweep.bench.costs import cost_model

    cfg = compose("model=tiny-llama", "seed=31", "gate=full", "prompts.n=1", "bench.gen_tokens=4")
    lm, gate, prompts = prepare(cfg)  # seed=31: a model of its own, its cost model not measured yet
    events: list[progress.Event] = []
    with progress.listen(events.append):
        row = run_trial(cfg, lm, gate, prompts)
    phases = {e.phase for e in events}
    assert "cost model: step rounds" in phases and not [p for p in phases if "probe" in p or "K/V" in p]
    costs = cost_model(lm, prompts[0].input_ids, gates=[gate])  # the one measured, kept with the model
    assert costs.extra_probe_ms == {} and costs.lens_probe_ms is None and costs.hidden_probe_ms is None
    assert costs.kv_ms is None and row["cost_probe_ms"] == 0.0 and row["cost_kv_ms"] is None
    assert row["speedup_model"] == pytest.approx(1.0)

    sat = compose("model=tiny-llama", "seed=31", "gate=saturation", "gate.eps=0.2", "prompts.n=1", "bench.gen_tokens=4")
    model = lm
    lm, gate, prompts = prepare(sat)
    assert lm is model  # the process's session keeps it: the same model, its cost model measured once
    events.clear()
    with progress.listen(events.append):
        run_trial(sat, lm, gate, prompts)
    assert "cost model: probe saturation/hidden" in {e.phase for e in events}
    costs = cost_model(lm, prompts[0].input_ids, gates=[gate])
    assert costs.extra_probe_ms["saturation/hidden"] > 0 and costs.kv_ms is not None  # it exits: its fill


def test_workers_progress_reaches_the_driver(ray_session, tmp_path):
    """A sweep's Ray workers forward their phases to the driver: its listeners (and display) see each Tune
    trial's timed rounds to the end, the settings' count, and the breakdown of the workers' parts."""
    from conftest import sweep

    events: list[progress.Event] = []
    with progress.breakdown() as times, progress.listen(events.append):
        two = "sweep.max_concurrent=null"  # two workers side by side (the default), each forwarding its own
        outcome = sweep(tmp_path, "search=saturation-grid", "bench.repeats=2", "sweep.shared_baseline=4", two)
    assert outcome.written == 8
    sources = {e.source for e in events if e.source is not None}
    assert len(sources) == 2 and all(s.startswith("Tune trial ") for s in sources)  # 8 settings, bundles of 4
    for source in sources:
        ends = [e for e in events if e.source == source and e.kind == "end" and e.phase == "timed rounds"]
        assert len(ends) == 1 and ends[0].done == ends[0].total == 2  # 2 repeats x 1 prompt
    settings = [e for e in events if e.phase == "settings" and e.kind == "step"]
    assert [e.done for e in settings] == list(range(1, 9)) and all(e.total == 8 and e.text for e in settings)
    notes = [e.text for e in events if e.kind == "note"]
    assert sum("4 settings timed against one shared baseline" in n for n in notes) == 2
    assert {"load", "cost model", "warm-up and self-check", "timed rounds", "writing"} <= set(times.seconds)
    assert times.sources == sources


def test_a_screens_trace_and_replay_show_on_the_driver(ray_session, tmp_path):
    from conftest import sweep

    events: list[progress.Event] = []
    with progress.listen(events.append):
        outcome = sweep(tmp_path, "search=screen", "bench.gen_tokens=6", "search.neighbours=0")
    assert outcome.simulated is not None
    traced = [e for e in events if e.source == "screen trace" and e.phase == "profile" and e.kind == "end"]
    assert len(traced) == 1 and traced[0].done == traced[0].total == 1  # the one prompt
    replay = [e for e in events if e.phase == "replay" and e.kind == "end"]
    assert len(replay) == 1 and replay[0].source is None and replay[0].done == replay[0].total > 1


def _live_progress_actors() -> set[int]:
    """The processes of progress actors under this test session (an embedded Ray's workers are its
    descendants; an actor's process is named after its class)."""
    from conftest import descendants

    def named(pid: int) -> str:
        try:
            return (Path("/proc") / str(pid) / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return ""

    return {pid for pid in descendants(os.getpid()) if named(pid).startswith("ray::ProgressHub")}


def _settled(before: set[int], timeout_s: float = 120.0) -> set[int]:
    """The progress actors a sweep left alive beyond ``before``, once a killed one has had time to exit."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = _live_progress_actors() - before
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def test_a_sweep_stops_the_progress_actor_it_started_however_it_ends(ray_session, tmp_path):
    """An embedded Ray outlives a sweep run in-process (a notebook's several sweeps, this test session): each
    sweep stops its progress actor, whether it ran trials, found them all done, or screened skip sets."""
    from conftest import sweep

    before = _live_progress_actors()
    assert sweep(tmp_path, "search=saturation-grid").written == 8
    assert _settled(before) == set()
    assert sweep(tmp_path, "search=saturation-grid").written == 0  # every row exists: nothing runs
    assert _settled(before) == set()
    skip = tmp_path / "skip"
    assert sweep(skip, "search=skipset-random", "search.n_trials=4", "search.closed_loop=1").written == 1
    assert _settled(before) == set()


def test_a_sweeps_eta_comes_from_the_work_left_and_steps_down_evenly_through_a_bundle(tmp_path):
    """The settings' ETA from the measured time per unit of decode work, not from settings counted: four rows of
    one bundle arriving together step it down by one setting's time each (the count-based ETA, from the elapsed
    time of the rows so far, would read near zero here: they took no wall time in this test), a setting with
    twice the work left counts twice, and the last row leaves nothing."""
    from sweep.bench.command import run_bench
    from sweep.orchestrate.writer import RowWriter

    cfg = compose("model=tiny-llama", "gate=margin", "gate.theta=1", "prompts.n=2", f"results.root={tmp_path / 'b'}")
    _, real, _ = run_bench(cfg)
    real = dict(real)

    def result(i: int, **changes) -> dict:
        row = {**real, "trial_id": f"{i:016x}", "bench_seconds": 10.0, "trial_seconds": 10.0, "baseline_shared": 4}
        row.update(changes)
        return {"row": row, "cached": False, "status": "ok"}

    writer = RowWriter(str(tmp_path / "r"), 6, [], "run", "eta", "cpu")
    etas = []
    with progress.listen(lambda e: etas.append(e.eta) if e.phase == "settings" and e.kind == "step" else None):
        writer.started("bundle")
        for i in range(4):
            writer.result("bundle", result(i))
        writer.complete("bundle")
        writer.started("last")
        writer.result("last", result(4, repeats=real["repeats"] * 2, baseline_shared=1, bench_seconds=40.0))
        writer.result("last", result(5, bench_seconds=10.0))
    writer.close()
    # each setting of the bundle: 10 s per its work; 6 settings, so 5, 4, 3, 2 left at that pace
    assert etas[:4] == pytest.approx([50.0, 40.0, 30.0, 20.0])
    # one setting of twice the repeats, alone: 4x the work of a bundle's setting (2 * (1 + 2/1) / (1 + 2/4)), and
    # 40 s: the pace held; one setting left, at the median work
    assert etas[4] == pytest.approx(10.0) and etas[5] == 0.0
