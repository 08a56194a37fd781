"""Sweeps that share a results root: each trial computed once, no finished row replaced,
claims of dead workers broken, and a resume that loads no pickle from shared storage."""

from __future__ import annotations

import logging

import json
import os
import pickle
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from conftest import subprocess_env
from helpers.waiting import Background, finishes, wait_for
from helpers.factories import full_trial_row
from sweep.orchestrate import claims
from sweep.orchestrate.writer import RowWriter, row_path
from sweep.store import files, read

SWEEP = str(Path(sys.executable).with_name("sweep"))
TRIALS = ["model=tiny-llama", "prompts.n=2", "bench.gen_tokens=24", "bench.repeats=4", "bench.warmup=0"]


env = subprocess_env


def owner(run_id: str, pid: int | None = None, host: str | None = None) -> claims.Owner:
    return claims.Owner(run_id, f"sweep-{run_id}", host or socket.gethostname(), pid or os.getpid())


# ---------------------------------------------------------------- claims, in one process


def waiting_said(caplog) -> bool:
    """A claimant said it waits for another sweep's claim (``claims.hold`` logs it once, as it starts waiting)."""
    return any("waiting for its row" in r.getMessage() for r in caplog.records)


def test_a_second_claimant_waits_for_the_first_and_gets_its_row(tmp_path, caplog):
    done: dict = {}
    with caplog.at_level("INFO", logger="sweep.orchestrate.claims"):
        with claims.hold(tmp_path, "t1", owner("a"), lambda: done.get("row")) as first:
            assert first.row is None  # A computes

            def second():
                with claims.hold(tmp_path, "t1", owner("b"), lambda: done.get("row")) as held:
                    return held

            b = Background(second, "B's claim")
            wait_for(lambda: waiting_said(caplog), "B to wait for A's claim")
            assert not b.done, "B must wait while A holds the claim"
            done["row"] = {"trial_id": "t1", "status": "ok"}
        assert b.result().row == {"trial_id": "t1", "status": "ok"}


def test_a_claim_released_without_a_row_is_taken_by_the_waiter(tmp_path, caplog):
    with caplog.at_level("INFO", logger="sweep.orchestrate.claims"):
        with claims.hold(tmp_path, "t1", owner("a"), lambda: None):

            def second():
                with claims.hold(tmp_path, "t1", owner("b"), lambda: None) as held:
                    return held

            b = Background(second, "B's claim")
            wait_for(lambda: waiting_said(caplog), "B to wait for A's claim")
            assert not b.done
            claims.release(tmp_path, "t1", "a")  # A's driver wrote a failed row: B must run the trial
            assert b.result().row is None


def test_stale_and_dead_claims_are_broken_but_live_ones_are_not(tmp_path, caplog):
    path = claims.claim_path(tmp_path, "t1")
    path.parent.mkdir(parents=True)
    # another host's claim, recently touched: wait (here: until it goes stale, after 3 s untouched)
    path.write_text(json.dumps({**owner("x", host="elsewhere").__dict__}))

    def waiter():
        with claims.hold(tmp_path, "t1", owner("b"), lambda: None, stale_s=3) as held:
            return held, json.loads(path.read_text())["run_id"]

    with caplog.at_level("INFO", logger="sweep.orchestrate.claims"):
        b = Background(waiter, "B's claim")
        wait_for(lambda: waiting_said(caplog), "B to wait for the other host's claim")
        assert not b.done, "a fresh claim of another host must be waited for"
        held, now = b.result()  # then it goes stale (no heartbeat) and is broken
    assert held.row is None and now == "b" and "stale" in " ".join(held.notes)
    path.unlink()
    # a claim of a process of this host that no longer exists: broken at once, not after stale_s
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    path.write_text(json.dumps({**owner("x", pid=int(dead.stdout)).__dict__}))

    def take():
        with claims.hold(tmp_path, "t1", owner("b"), lambda: None, stale_s=600) as held:
            return held

    assert finishes(take, "taking over a dead process's claim (stale_s=600 would be a hang)").row is None


def test_a_heartbeat_keeps_a_long_trial_claimed(tmp_path):
    with claims.hold(tmp_path, "t1", owner("a"), lambda: None, heartbeat_s=0.2):
        path = claims.claim_path(tmp_path, "t1")
        old = time.time() - 100
        os.utime(path, (old, old))
        wait_for(lambda: path.stat().st_mtime > old + 50, "the heartbeat to touch the claim")


def test_a_claim_of_this_run_is_taken_over_at_once(tmp_path):
    """A retried trial: the worker of the same run died holding the claim."""
    path = claims.claim_path(tmp_path, "t1")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({**owner("a", host="elsewhere").__dict__}))
    with claims.hold(tmp_path, "t1", owner("a"), lambda: None, stale_s=600) as held:
        assert held.row is None


@pytest.mark.parametrize("bad", ["../x", ".hidden", "a/b", ".."])
def test_claims_refuse_names_that_are_not_a_path_component(tmp_path, bad):
    with pytest.raises(Exception, match="trial_id"):
        claims.claim_path(tmp_path, bad)


# ---------------------------------------------------------------- the row writer


def _fake_row(tmp_path, tid, status="ok", run_id="r0"):
    """A row written through the store, as another sweep's driver writes it."""
    from sweep.store import write_table  # the store's own, even where a test wraps the one write_or_keep calls

    row = full_trial_row(tid, status, run_id)
    return write_table("trials", {k: [v] for k, v in row.items()}, root=tmp_path, provenance={}, stem=tid)


def test_the_writer_never_replaces_a_finished_row_unless_rerun(tmp_path):
    path = _fake_row(tmp_path, "t1", run_id="first")
    before = path.stat().st_mtime_ns
    writer = RowWriter(str(tmp_path), 1, [], "second", "s", "cpu")
    assert writer.write(full_trial_row("t1", run_id="second")) is False
    assert path.stat().st_mtime_ns == before and writer.written == 0 and writer.existing == 1
    assert pl.read_parquet(path)["run_id"].item() == "first"


# ---------------------------------------------------------------- real sweeps


def _counts(out: str) -> tuple[int, int]:
    m = re.search(r"(\d+) settings? measured and written, (\d+) skipped", out)
    assert m, out[-2000:]
    return int(m.group(1)), int(m.group(2))


@pytest.mark.ray
def test_two_sweeps_into_one_root_compute_each_trial_once(tmp_path):
    args = [SWEEP, "run", *TRIALS, f"results.root={tmp_path}", "resources.cpu=1"]
    procs = [
        subprocess.Popen(args, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    counts = [_counts(out) for out, _ in outs]
    df = read("trials", tmp_path)
    assert df.height == 8 and df["trial_id"].n_unique() == 8 and len(files("trials", tmp_path)) == 8
    assert set(df["status"]) == {"ok"}
    assert sum(w for w, _ in counts) == 8, counts  # each trial computed (and written) once, by one of the sweeps
    assert all(w + s == 8 for w, s in counts), counts  # each sweep accounts for all 8
    # every row was written by the sweep whose run computed it, and every claim was released
    assert sorted(df["run_id"].value_counts()["count"].to_list()) == sorted(w for w, _ in counts if w)
    assert not list((tmp_path / "claims").glob("*.json"))
    print("concurrent sweeps (written, skipped):", counts)


@pytest.mark.ray
def test_resume_loads_no_pickle_and_rewrites_no_row(tmp_path):
    """A planted tuner.pkl in the sweep's Tune directory is never unpickled, and a resume
    writes only the rows that are missing."""
    space = "search.spaces=[{gate: saturation, gate.min_layer: 2, gate.eps: 'choice(0.05,0.1,0.2,0.4)'}]"
    args = [SWEEP, "run", *TRIALS, f"results.root={tmp_path}", space]
    first = subprocess.run(args, env=env(), capture_output=True, text=True, timeout=240)
    assert first.returncode == 0, first.stderr[-2000:]
    assert set(read("trials", tmp_path)["status"]) == {"ok"}
    name = re.search(r"sweep (\S+): ", first.stdout).group(1)
    victim = sorted(files("trials", tmp_path))[0]
    victim.unlink()  # one row lost: the resume must compute exactly that one
    stamps = {p: p.stat().st_mtime_ns for p in files("trials", tmp_path)}
    marker = tmp_path / "pwned"

    class Planted:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    sweep_dir = tmp_path / "ray" / name
    for pkl in [sweep_dir / "tuner.pkl", sweep_dir / "trainable.pkl", *sweep_dir.glob("searcher-state-*.pkl")]:
        pkl.write_bytes(pickle.dumps(Planted()))
    resumed = subprocess.run(
        [*args, "resume=true", f"sweep.name={name}"], env=env(), capture_output=True, text=True, timeout=240
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert not marker.exists(), "a pickle from the shared root was loaded"
    assert _counts(resumed.stdout) == (1, 3)
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps  # the 3 finished rows untouched
    assert victim.exists() and read("trials", tmp_path).height == 4


def test_a_row_that_appears_while_the_writer_writes_is_kept(tmp_path, monkeypatch):
    import sweep.store._io

    real = sweep.store._io.write_table

    def racing(*args, **kwargs):  # another sweep's driver wins the race to the same file
        _fake_row(tmp_path, "t1", run_id="first")
        return real(*args, **kwargs)

    monkeypatch.setattr(sweep.store._io, "write_table", racing)  # the store's own write, under write_or_keep
    writer = RowWriter(str(tmp_path), 1, [], "second", "s", "cpu")
    assert writer.write(full_trial_row("t1", run_id="second")) is False
    assert (writer.written, writer.existing) == (0, 1)
    assert pl.read_parquet(row_path(tmp_path, "m", "saturation", "t1"))["run_id"].item() == "first"


def test_a_failed_row_is_replaced_by_the_trials_next_run(tmp_path):
    path = _fake_row(tmp_path, "t1", status="failed", run_id="first")
    writer = RowWriter(str(tmp_path), 1, [], "second", "s", "cpu")
    assert writer.write(full_trial_row("t1", run_id="second")) is True
    assert pl.read_parquet(path)["run_id"].item() == "second"


# ---------------------------------------------------------------- planted claims (issue 25): never fatal, no long wait

HOST = socket.gethostname()
PLANTED_CLAIMS = {
    "a JSON list": b"[]",
    "a JSON string": b'"claim"',
    "JSON null": b"null",
    "an empty object": b"{}",
    "garbage bytes": b"\x00\xff garbage \x80",
    "an empty file": b"",
    "a huge pid": json.dumps({"run_id": "x", "sweep_name": "s", "host": HOST, "pid": 99999999999999999999}).encode(),
    "a huge pid of another host": json.dumps(
        {"run_id": "x", "sweep_name": "s", "host": "elsewhere", "pid": 2**70}
    ).encode(),
    "a negative pid": json.dumps({"run_id": "x", "sweep_name": "s", "host": HOST, "pid": -1}).encode(),
    "pid 0 (every process of the group)": json.dumps(
        {"run_id": "x", "sweep_name": "s", "host": HOST, "pid": 0}
    ).encode(),
    "a pid that is a string": json.dumps({"run_id": "x", "sweep_name": "s", "host": HOST, "pid": "1"}).encode(),
    "a pid that is a float": json.dumps({"run_id": "x", "sweep_name": "s", "host": HOST, "pid": 1.5}).encode(),
    "a run id that is a number": json.dumps({"run_id": 7, "sweep_name": "s", "host": HOST, "pid": 1}).encode(),
    "a deeply nested document": b"[" * 30000 + b"]" * 30000,
    "a claim of a megabyte": json.dumps({"run_id": "x" * 2**20, "sweep_name": "s", "host": HOST, "pid": 1}).encode(),
}


@pytest.mark.parametrize("content", PLANTED_CLAIMS.values(), ids=PLANTED_CLAIMS.keys())
def test_a_claim_that_is_not_a_claim_is_taken_over_in_seconds_and_named(tmp_path, content, caplog):
    path = claims.claim_path(tmp_path, "t1")
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    # planted before the grace period given a claim still being written (the next test waits through that period)
    planted = time.time() - claims.GRACE_S - 1
    os.utime(path, (planted, planted))

    def take():
        with claims.hold(tmp_path, "t1", owner("b"), lambda: None, stale_s=600) as held:
            return held, json.loads(path.read_text())["run_id"]

    with caplog.at_level("WARNING", logger="sweep.orchestrate.claims"):
        held, now = finishes(take, "taking over a claim that is not one (waiting for stale_s=600 is a hang)")
    assert held.row is None and now == "b"  # ours now
    [note] = held.notes
    assert note.startswith(f"took over the stale claim {path} (not a claim: "), note
    assert [r.getMessage() for r in caplog.records] == [note]  # logged once, named


def test_a_fresh_unreadable_claim_is_waited_for_briefly_in_case_it_is_being_written(tmp_path):
    path = claims.claim_path(tmp_path, "t1")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"")

    def waiter():
        with claims.hold(tmp_path, "t1", owner("b"), lambda: None, stale_s=600) as held:
            return held

    b = Background(waiter, "B's claim")
    path.write_text(json.dumps(owner("a").__dict__))  # its writer finished: a live claim of this process
    # B has had its chance to break it: the claim is older than the grace period of a claim being written
    wait_for(lambda: time.time() - path.stat().st_mtime > claims.GRACE_S + 1, "the claim to pass the grace period")
    assert not b.done, "a claim whose writer finished within the grace period must be waited for"
    claims.release(tmp_path, "t1", "a")
    assert b.result().row is None


def test_a_claims_directory_that_is_a_file_runs_the_trial_unclaimed(tmp_path):
    (tmp_path / "claims").write_text("planted")
    with claims.hold(tmp_path, "t1", owner("a"), lambda: None) as held:
        assert held.row is None
    [note] = held.notes
    assert note.startswith("trial t1 runs unclaimed") and f"{tmp_path / 'claims'} is not a directory" in note
    claims.release(tmp_path, "t1", "a")  # the driver's release is harmless too
    assert claims.release_run(tmp_path, "a") == [] and (tmp_path / "claims").read_text() == "planted"


def test_a_claims_directory_linked_out_of_the_root_is_never_written_through(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "claims").symlink_to(elsewhere)
    with claims.hold(tmp_path / "root", "t1", owner("a"), lambda: None) as held:
        assert held.row is None and "runs unclaimed" in held.notes[0]
    claims.release(tmp_path / "root", "t1", "a")
    assert list(elsewhere.iterdir()) == []
    with pytest.raises(Exception, match="outside it"):
        claims.check_dir(tmp_path / "root")


def test_a_stale_break_file_of_a_dead_breaker_delays_nothing_for_long(tmp_path):
    path = claims.claim_path(tmp_path, "t1")
    path.parent.mkdir(parents=True)
    path.write_bytes(b"[]")
    guard = path.with_name(path.name + ".break")
    guard.write_text("")
    stamp = time.time() - claims.BREAK_S - 1
    os.utime(guard, (stamp, stamp))

    def take():
        with claims.hold(tmp_path, "t1", owner("b"), lambda: None, stale_s=600) as held:
            return held

    assert finishes(take, "passing a dead breaker's break file (stale_s=600 would be a hang)").row is None


def test_release_run_removes_only_this_runs_claims(tmp_path):
    for tid, run in (("t1", "a"), ("t2", "a"), ("t3", "b")):
        assert claims._try_create(claims.claim_path(tmp_path, tid), owner(run))
    (tmp_path / "claims" / "junk.json").write_bytes(b"[]")
    removed = claims.release_run(tmp_path, "a")
    assert sorted(p.name for p in removed) == ["t1.json", "t2.json"]
    assert sorted(p.name for p in (tmp_path / "claims").iterdir()) == ["junk.json", "t3.json"]


@pytest.mark.ray
def test_a_sweep_takes_over_planted_claims_of_its_trials_and_completes(ray_session, tmp_path, caplog):
    """Garbage claims planted for every trial of a sweep, and R/claims/.. a file elsewhere: the sweep
    completes in about the time it takes, names each claim it took over, and writes every row."""
    from conftest import TINY_SWEEP, compose, sweep
    from sweep.config.identity import trial_identity
    from sweep.orchestrate.plan import plan_sweep

    space = "search.spaces=[{gate: saturation, gate.min_layer: 2, gate.eps: 'choice(0.05,0.1)'}]"
    args = [*TINY_SWEEP, f"results.root={tmp_path}", space]
    ids = [trial_identity(c, "cpu").id for _, c in plan_sweep(compose(*args), args).grid_trials]
    contents = list(PLANTED_CLAIMS.values())
    (tmp_path / "claims").mkdir()
    for i, tid in enumerate(ids):
        (tmp_path / "claims" / f"{tid}.json").write_bytes(contents[i % len(contents)] or b"[]")
    with caplog.at_level("WARNING", logger="sweep.orchestrate.writer"):
        outcome = sweep(tmp_path, space)
    assert outcome.written == 2 and sorted(read("trials", tmp_path)["trial_id"]) == sorted(ids)
    notes = [r.getMessage() for r in caplog.records if r.name == "sweep.orchestrate.writer"]
    assert sorted(n.split(" (")[0] for n in notes if n.startswith("took over")) == sorted(
        f"took over the stale claim {tmp_path / 'claims' / tid}.json" for tid in ids
    )
    # each taken over for what it holds, at once, never after waiting for it to go stale
    assert all(" (not a claim: " in n for n in notes if n.startswith("took over")), notes
    assert not list((tmp_path / "claims").glob("*.json"))


def test_a_sweep_into_a_root_whose_claims_is_a_file_completes_unclaimed(ray_session, tmp_path, caplog):
    from conftest import sweep

    (tmp_path / "claims").write_text("planted by someone else")
    space = "search.spaces=[{gate: saturation, gate.min_layer: 2, gate.eps: 'choice(0.05,0.1)'}]"
    with caplog.at_level("WARNING"):
        outcome = sweep(tmp_path, space)
    assert outcome.written == 2 and set(read("trials", tmp_path)["status"]) == {"ok"}
    messages = [r.getMessage() for r in caplog.records]
    assert any(
        m.startswith(f"{tmp_path / 'claims'} is not a directory: this sweep's trials run unclaimed") for m in messages
    )
    assert sum("runs unclaimed" in m for m in messages if m.startswith("trial ")) == 2  # each trial said so
    assert not [m for m in messages if "invalid value" in m]  # the notes reach Tune, not its TensorBoard logger's line
    # (Ray says it once per process, so an earlier test may have used it up: the logger itself is quiet)
    assert not logging.getLogger("ray.tune.logger.tensorboardx").isEnabledFor(logging.WARNING)
