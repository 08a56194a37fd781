"""Faults a sweep on shared storage meets (issue 25), each real: a SIGTERM to a real `sweep run`, a
full filesystem (a small tmpfs) while rows are written, a trial that raises, and corrupt model files
(a truncated safetensors file in an HF directory and in the GGUF conversion cache). Each ends in one
line naming what to do, and no row is lost: a resume computes exactly what is missing, once."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.rows import wait_for_rows
from conftest import full_disk, subprocess_env
from helpers.tiny_gguf import write_tiny_gguf
from sweep.cli.commands import main
from sweep.store import files, read

pytestmark = pytest.mark.faults

SWEEP = str(Path(sys.executable).with_name("sweep"))
SPACE = "search.spaces=[{gate: saturation, gate.min_layer: 2, gate.eps: 'choice(0.05,0.1,0.2,0.4)'}]"
# one setting per Tune trial, one at a time: rows land one by one
ONE_BY_ONE = ["sweep.shared_baseline=1", "sweep.max_concurrent=1"]
TRIALS = ["model=tiny-llama", "prompts.n=2", "bench.gen_tokens=24", "bench.repeats=4", "bench.warmup=0"]
TINY = ["model=tiny-llama", "prompts.n=1", "bench.gen_tokens=4", "bench.repeats=1", "bench.warmup=0"]


def resume_line(err: str) -> str:
    """The `sweep run ...` command of the one resume line in ``err``."""
    [line] = [line for line in err.splitlines() if "resume with `sweep run " in line]
    return re.search(r"resume with `(sweep run [^`]*)`", line).group(1)


def written(out: str) -> int:
    return int(re.search(r"(\d+) settings? measured and written", out).group(1))


# ---------------------------------------------------------------- 5. SIGTERM


@pytest.mark.ray
def test_a_sweep_stopped_in_its_screen_says_its_resume_line_as_one_stopped_in_tune_does(tmp_path):
    """A signal during a skip-set screen (recorded, before Tune) ended `error: stopped by SIGTERM; resume with ...`,
    where one in Tune ends `stopped by SIGTERM: resume with ...`: one form, so whatever reads the line finds it."""
    from helpers.waiting import wait_for
    from sweep.orchestrate.plan import DEFINITION

    root = tmp_path / "r"
    args = [SWEEP, "run", *TINY, f"results.root={root}", "search=skipset-random", "search.n_trials=256"]
    proc = subprocess.Popen(args, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: proc.poll() is not None or list(root.rglob(DEFINITION)), "the sweep's definition")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 143, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("stopped by SIGTERM: resume with `sweep run "), err[-3000:]
    assert "search.n_trials=256" in resume_line(err) and not list(root.glob("trials/**/*.parquet"))


def hangs_up() -> None:
    """A child's SIGHUP at its default, whatever this run inherited (a suite started under `nohup` ignores it, and a
    command started ignoring SIGHUP keeps ignoring it, as it should)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.mark.ray
def test_sigterm_stops_a_sweep_as_sigint_does_and_the_resume_runs_each_trial_once(tmp_path):
    root = tmp_path / "r"
    args = [SWEEP, "run", *TRIALS, f"results.root={root}", SPACE, *ONE_BY_ONE]
    proc = subprocess.Popen(args, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_rows(root, 1, proc)
    proc.send_signal(signal.SIGTERM)  # what timeout, Kubernetes and systemd send
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 143, err[-3000:]  # 128 + SIGTERM, not 134 (Ray's abort)
    assert "SIGTERM received" not in err and "Traceback" not in err and "Tuner.restore" not in err, err[-3000:]
    # the stop is said when it lands (the running settings and Ray take seconds to stop), and how to stop sooner
    stopping = [line for line in err.splitlines() if "stopping the running settings" in line]
    assert len(stopping) == 1 and "stopped by SIGTERM" in stopping[0] and "SIGTERM again" in stopping[0], err[-3000:]
    command = resume_line(err)
    assert command.count("resume=true") == 1 and command.count("sweep.name=") == 1
    assert not list((root / "claims").glob("*.json")), "the stopped run's claims were not released"
    first = written(out)
    assert 1 <= first < 4
    assert "; stopped before its end: the rest are measured on the resume" in " ".join(out.split())  # stdout alone
    resumed = subprocess.run([SWEEP, "run", *_split(command)], env=subprocess_env(), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert written(resumed.stdout) == 4 - first  # each trial computed exactly once over the two runs
    assert "stopped before its end" not in resumed.stdout
    df = read("trials", root)
    assert df.height == 4 and df["trial_id"].n_unique() == 4 and set(df["status"]) == {"ok"}
    assert len(files("trials", root)) == 4  # rows lost: 0


@pytest.mark.ray
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_while_ray_starts_stops_the_sweep_in_one_line(tmp_path, sig):
    """A SIGTERM that lands while ray.init runs reached the handler Ray installs there (sys.exit(15)): exit code 15
    and nothing said. Now it stops the sweep as any SIGTERM does: 143, one line, Ray stopped; a SIGHUP (its terminal
    closed) likewise, 129 (before: killed by it, nothing said)."""
    import glob
    import shutil
    import tempfile

    from helpers.waiting import wait_for

    own = tempfile.mkdtemp(prefix="sweep-st-", dir="/tmp")  # Ray's sessions of this run alone (short socket paths)
    try:
        env = {**subprocess_env(), "RAY_TMPDIR": own}
        args = [SWEEP, "run", *TINY, f"results.root={tmp_path / 'r'}"]
        proc = subprocess.Popen(
            args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=hangs_up
        )
        wait_for(lambda: glob.glob(f"{own}/ray/session_2*/logs/gcs_server*") or proc.poll() is not None, "Ray to start")
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 128 + sig, err[-3000:]
        assert [line for line in err.splitlines() if line.strip()] == [f"error: stopped by {sig.name}"], err[-3000:]
        gcs = [pid for pid in os.listdir("/proc") if pid.isdigit() and own in _environ(pid)]
        wait_for(lambda: not [pid for pid in gcs if os.path.exists(f"/proc/{pid}")], "the run's Ray to stop")
    finally:
        shutil.rmtree(own, ignore_errors=True)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_ends_any_command_in_one_line_as_ctrl_c_does(tmp_path, sig):
    """`sweep fit` (as `bench`, `profile`, `calibrate`, `analyze`) stopped mid-work by SIGTERM (timeout, Kubernetes)
    or SIGHUP (its terminal closed): one line, exit code 128 + the signal, its output not written (before: killed by
    the signal itself, nothing said, and whatever its cleanup would have removed left behind)."""
    out = tmp_path / "fit" / "readouts.safetensors"
    args = [SWEEP, "fit", "model=tiny-llama", "prompts.n=4", "fit.gen_tokens=8", f"fit.out={out}"]
    proc = subprocess.Popen(
        args, env=subprocess_env(CI="1"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=hangs_up
    )
    seen = []
    for line in proc.stderr:  # a line per step: the signal lands while the prompts decode
        seen.append(line)
        if "[2/4]" in line:
            proc.send_signal(sig)
            break
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + sig, "".join(seen) + err
    assert [line for line in err.splitlines() if line.startswith("error:")] == [f"error: stopped by {sig.name}"]
    assert not out.exists() and not out.parent.exists()


def _fit_until_its_second_prompt(tmp_path, preexec=None) -> tuple[subprocess.Popen, list[str], Path]:
    """`sweep fit` on tiny-llama, read until its second prompt's line (a line per step): the process, what it said,
    and its output file."""
    out = tmp_path / "fit" / "readouts.safetensors"
    args = [SWEEP, "fit", "model=tiny-llama", "prompts.n=10", "fit.gen_tokens=8", f"fit.out={out}"]
    proc = subprocess.Popen(
        args, env=subprocess_env(CI="1"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=preexec
    )
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "[2/10]" in line:
            break
    return proc, seen, out


def test_a_signal_the_command_was_started_ignoring_stays_ignored(tmp_path):
    """`nohup` starts a command ignoring SIGHUP, so that a closed terminal leaves it running: it still runs to its
    end (the stop handling first took SIGHUP over); and a command a script started in the background (SIGINT
    ignored) still stops on SIGTERM, in one line (the SIGINT raised to stop it did nothing: the SIGTERM was lost)."""
    proc, seen, out = _fit_until_its_second_prompt(tmp_path, lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0 and list(out.rglob("*.safetensors")), "".join(seen) + err

    ignoring = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)  # noqa: E731
    proc, seen, out = _fit_until_its_second_prompt(tmp_path / "bg", ignoring)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 143 and not out.exists(), "".join(seen) + err
    assert [line for line in err.splitlines() if line.startswith("error:")] == ["error: stopped by SIGTERM"]


def test_a_closed_terminal_stops_a_command_with_129_not_a_traceback(tmp_path):
    """The terminal a command runs on goes away (the kernel's SIGHUP to its session): its last line cannot be
    written there (EIO), which ended it with a traceback and exit code 1; it ends with 129 and writes nothing."""
    import fcntl
    import pty
    import termios

    master, slave = pty.openpty()

    def on_the_terminal():
        hangs_up()
        os.setsid()
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)

    out = tmp_path / "fit" / "readouts.safetensors"
    args = [SWEEP, "fit", "model=tiny-llama", "prompts.n=10", "fit.gen_tokens=8", f"fit.out={out}"]
    proc = subprocess.Popen(
        args, env=subprocess_env(CI="1"), stdin=slave, stdout=slave, stderr=slave, preexec_fn=on_the_terminal
    )
    os.close(slave)
    said = b""
    try:
        while b"[2/10]" not in said:
            said += os.read(master, 4096)
    finally:
        os.close(master)  # the terminal goes away
    assert proc.wait(timeout=180) == 129, said.decode(errors="replace")[-2000:]
    assert not out.exists()


def _environ(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.ray
def test_sigterm_to_the_drivers_process_group_stops_the_sweep_not_ray_under_it(tmp_path):
    """`timeout` (and a shell's job control) signal the whole process group: the embedded Ray's servers, which the
    driver starts, are not in it, so the driver stops the sweep and Ray in order (before, the GCS died first and the
    driver waited 60 s for it, printed no resume line and left its claims)."""
    root = tmp_path / "r"
    args = [SWEEP, "run", *TRIALS, f"results.root={root}", SPACE, *ONE_BY_ONE]
    proc = subprocess.Popen(
        args, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    wait_for_rows(root, 1, proc)
    os.killpg(proc.pid, signal.SIGTERM)  # as `timeout 60 sweep run ...` does when its time is up
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 143, err[-3000:]
    assert "Failed to connect to GCS" not in err and "Traceback" not in err, err[-3000:]
    assert resume_line(err).count("resume=true") == 1
    assert not list((root / "claims").glob("*.json")), "the stopped run's claims were not released"
    assert 1 <= written(out) < 4


@pytest.mark.ray
def test_sigterm_while_a_sweep_waits_on_another_sweeps_claim_ends_it_with_a_resume_line(tmp_path):
    """The one wait a sweep has by design (a trial another live sweep holds): SIGTERM there ends the sweep as it does
    mid-trial, with rc 143 and the resume line, and leaves the other sweep's claim alone."""
    import socket
    import threading

    from conftest import compose
    from helpers.waiting import wait_for
    from sweep.config.identity import trial_identity
    from sweep.orchestrate import claims
    from sweep.orchestrate.plan import plan_sweep

    root = tmp_path / "r"
    overrides = [*TINY, f"results.root={root}", "search.spaces=[{gate: full}]"]
    [(_, cfg)] = plan_sweep(compose(*overrides), overrides).grid_trials
    tid = trial_identity(cfg, "cpu").id
    other = claims.Owner("other-run", "other-sweep", socket.gethostname(), os.getpid())  # alive: this process
    with claims.hold(root, tid, other, lambda: None):
        proc = subprocess.Popen(
            [SWEEP, "run", *overrides], env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        err: list[str] = []
        reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
        reader.start()
        wait_for(lambda: any("waiting for its row" in line for line in err), "the sweep to wait on the claim", 240)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)  # a deadline only a hang reaches
        reader.join(timeout=30)
        text = "".join(err)
        assert proc.returncode == 143, text[-3000:]
        assert "Traceback" not in text and "unexpected" not in text, text[-3000:]
        assert resume_line(text).count("resume=true") == 1
        held = json.loads(claims.claim_path(root, tid).read_text())
        assert held["run_id"] == "other-run"  # the other sweep's claim stays


def _split(command: str) -> list[str]:
    import shlex

    return shlex.split(command)[2:]


def test_the_resume_hint_of_a_resumed_run_names_resume_once():
    from sweep.orchestrate.interrupt import resume_command

    hint = resume_command(["model=tiny-llama", "resume=true", "sweep.name=old", "run_id=r1", "x=1"], "s-1")
    assert hint == "sweep run model=tiny-llama x=1 resume=true sweep.name=s-1"


def test_a_second_stop_signal_after_a_tune_run_reaches_the_handler_from_before_it():
    """Tune installs a SIGINT handler for each run that, on the first signal, stops the run and puts back the
    handler it found; it leaves its own installed after the run. A sweep of two Tune runs (run-again passes) then had
    the first run's handler under the second's: a second Ctrl-C there stopped nothing, and nothing said that the
    first was taken. Each run now says its first stop and hands the second to the handler from before the run."""
    from sweep.orchestrate.interrupt import stop_said

    said, stops, reached = [], [], []

    def tune_run(announce) -> None:  # Tune's fit: its handler, installed for the run and left after it
        found = signal.getsignal(signal.SIGINT)

        def tune_handler(signum, frame):
            stops.append(len(said))
            signal.signal(signal.SIGINT, found)

        signal.signal(signal.SIGINT, tune_handler)
        announce()  # the callbacks' setup

    previous = signal.signal(signal.SIGINT, lambda signum, frame: reached.append(signum))
    try:
        with stop_said(said.append) as announce:
            tune_run(announce)  # the first run ends without a signal
        with stop_said(said.append) as announce:
            tune_run(announce)
            signal.raise_signal(signal.SIGINT)  # the first Ctrl-C: said, and Tune's handler stops the run
            signal.raise_signal(signal.SIGINT)  # the second: the handler from before the sweep, not the first run's
    finally:
        signal.signal(signal.SIGINT, previous)
    assert said == ["interrupted: stopping the running settings and Ray (Ctrl-C again to stop sooner)"]
    assert stops == [1] and reached == [signal.SIGINT]


def test_a_sweep_started_ignoring_sigint_keeps_ignoring_it_in_tune_and_sigterm_stops_it():
    """A job a script starts with `&` ignores SIGINT (Ctrl-C at that terminal is not for it). Tune's handler took
    the ignored SIGINT over, so a sweep ignored it in its screen and stopped on it in Tune; it is ignored in Tune too,
    and SIGTERM reaches Tune's stop, said, with SIGTERM again to stop sooner."""
    from sweep.orchestrate.interrupt import sigterm_as_sigint, stop_said

    said, tune_stops = [], []
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with sigterm_as_sigint(), stop_said(said.append) as announce:

            def tune_handler(signum, frame):  # Tune's: installed for the run, its original put back when it fires
                tune_stops.append(signum)
                signal.signal(signal.SIGINT, signal.SIG_IGN)

            signal.signal(signal.SIGINT, tune_handler)
            announce()
            signal.raise_signal(signal.SIGINT)  # Ctrl-C at the script's terminal
            assert tune_stops == [] and said == []
            signal.raise_signal(signal.SIGTERM)  # the first SIGTERM: said, and Tune's handler stops the run
            assert tune_stops == [signal.SIGINT]
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            with pytest.raises(KeyboardInterrupt):  # the second stops sooner
                signal.raise_signal(signal.SIGTERM)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert said == ["stopped by SIGTERM: stopping the running settings and Ray (SIGTERM again to stop sooner)"]


# ---------------------------------------------------------------- 6. a full disk


@pytest.mark.ray
def test_a_full_disk_while_rows_are_written_stops_in_one_line_and_the_resume_completes(small_disk):
    root, filler = small_disk
    args = [SWEEP, "run", *TINY, f"results.root={root}", SPACE, *ONE_BY_ONE]
    full = subprocess.run(args, env=subprocess_env(), capture_output=True, text=True, timeout=240)
    assert full.returncode == 1, full.stderr[-3000:]
    assert "Traceback" not in full.stderr and "unexpected" not in full.stderr, full.stderr[-3000:]
    [line] = [line for line in full.stderr.splitlines() if line.startswith("error:")]
    assert "no space left on device" in line and f"{root}/trials/model=tiny-llama/gate=saturation/" in line
    assert "resume with `sweep run " in line
    assert "(status ok, agreement " in line and ".tmp" not in line  # its figures, and the row's own path
    # nothing half-written: no row file, no temporary file, no claim left behind
    assert not [p for p in (root / "trials").rglob("*") if p.is_file()]
    assert not list((root / "claims").glob("*.json"))
    filler.unlink()  # space is back
    command = _split(resume_line(full.stderr))
    resumed = subprocess.run([SWEEP, "run", *command], env=subprocess_env(), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    df = read("trials", root)
    assert df.height == 4 and df["trial_id"].n_unique() == 4 and set(df["status"]) == {"ok"}  # rows lost: 0


@pytest.mark.ray
def test_a_disk_full_before_the_sweep_starts_is_one_line_naming_the_file_and_leaves_no_sweep(tmp_path):
    """Before: "unexpected OSError at pathlib.py", naming no file, and an empty sweep directory left each time."""
    with full_disk(tmp_path / "disk", free=0):
        root = tmp_path / "disk" / "results"
        args = [SWEEP, "run", *TINY, f"results.root={root}", SPACE, *ONE_BY_ONE]
        full = subprocess.run(args, env=subprocess_env(), capture_output=True, text=True, timeout=240)
        assert full.returncode == 1 and "Traceback" not in full.stderr and "unexpected" not in full.stderr
        [line] = [line for line in full.stderr.splitlines() if line.startswith("error:")]
        assert "cannot record the sweep's definition: " in line and "sweep-definition.json: no space left" in line
        assert not list((root / "ray").iterdir())


@pytest.mark.ray
def test_a_row_its_partition_cannot_take_is_kept_and_the_resume_does_not_redo_it(tmp_path):
    root = tmp_path / "results"
    args = [SWEEP, "run", *TINY, f"results.root={root}", SPACE, *ONE_BY_ONE]
    with full_disk(root / "trials" / "model=tiny-llama" / "gate=saturation"):
        full = subprocess.run(args, env=subprocess_env(), capture_output=True, text=True, timeout=240)
    assert full.returncode == 1, full.stderr[-3000:]
    assert "Traceback" not in full.stderr and "unexpected" not in full.stderr, full.stderr[-3000:]
    [line] = [line for line in full.stderr.splitlines() if line.startswith("error:")]
    [kept] = (root / "trials" / "kept").rglob("*.parquet")
    assert "no space left on device" in line and f"kept it at {kept}" in line and "resume with `sweep run " in line
    first = read("trials", root)
    assert first["trial_id"].to_list() == [kept.stem]  # the computed row landed (rows lost: 0)
    resumed = subprocess.run(
        [SWEEP, "run", *_split(resume_line(full.stderr))], env=subprocess_env(), text=True, capture_output=True
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    df = read("trials", root)
    assert df.height == 4 and df["trial_id"].n_unique() == 4 and set(df["status"]) == {"ok"}
    again = df.filter(df["trial_id"] == kept.stem)
    assert again["run_id"].to_list() == first["run_id"].to_list() and kept.exists()  # kept, not measured again


# ---------------------------------------------------------------- 7. a trial that raises; 8. corrupt model files


def truncated_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    weights = dst / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    return weights


def test_a_truncated_safetensors_file_is_named_in_one_line(hf_dir, tmp_path, capsys):
    weights = truncated_copy(hf_dir, tmp_path / "cut")
    code = main(["bench", "model=hf", f"model.path={tmp_path / 'cut'}", *TINY[1:], f"results.root={tmp_path / 'r'}"])
    err = capsys.readouterr().err
    assert code == 2 and "unexpected" not in err, err
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    assert f"{weights} is truncated or corrupt" in line
    garbage = tmp_path / "garbage"
    shutil.copytree(hf_dir, garbage)
    (garbage / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}" * 50)
    code = main(["bench", "model=hf", f"model.path={garbage}", *TINY[1:], f"results.root={tmp_path / 'r'}"])
    err = capsys.readouterr().err
    assert code == 2 and f"{garbage / 'model.safetensors'} is truncated or corrupt" in err, err
    assert not (tmp_path / "r").exists()


def test_a_trial_that_raises_is_one_failed_row_and_a_sweep_with_no_success_exits_nonzero(
    ray_session, hf_dir, tmp_path, capsys
):
    weights = truncated_copy(hf_dir, tmp_path / "cut")
    root = tmp_path / "r"
    code = main(
        ["run", "model=hf", f"model.path={tmp_path / 'cut'}", *TINY[1:], f"results.root={root}", SPACE, *ONE_BY_ONE]
    )
    captured = capsys.readouterr()
    assert code == 1, captured.err[-3000:]
    assert "lost its worker" not in captured.err and "more than sweep.max_failures" not in captured.err
    assert re.search(r"4 settings measured and written, 0 skipped \(their rows exist\), 4 failed", captured.out), (
        captured.out
    )
    assert "error: sweep " in captured.err and "no trial succeeded (4 failed" in captured.err
    df = read("trials", root)
    assert df.height == 4 and set(df["status"]) == {"failed"}
    assert all(f"{weights} is truncated or corrupt" in e for e in df["error"])  # the one-line error, once
    assert df["worker_pid"].n_unique() == 1  # one worker ran all four: none was restarted


def _bench_gguf_command(gguf: Path, cache: Path, root: Path) -> tuple[list[str], dict]:
    """`sweep bench` of a GGUF file, its cache in ``cache``: the command and its environment."""
    args = [SWEEP, "bench", "model=gguf", f"model.path={gguf}", *TINY[1:], f"results.root={root}"]
    return args, subprocess_env(SWEEP_CACHE_DIR=str(cache), OMP_NUM_THREADS="1")


def _bench_gguf(gguf: Path, cache: Path, root: Path) -> subprocess.CompletedProcess:
    """`sweep bench` of a GGUF file in a fresh process (a process loads a model once), cache in ``cache``."""
    args, env = _bench_gguf_command(gguf, cache, root)
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)


def said(res) -> str:
    """What a command said on stderr, its lines unwrapped (log lines wrap at 120 columns)."""
    return " ".join(res.stderr.split())


def test_a_corrupt_conversion_cache_entry_is_verified_and_rebuilt(tmp_path):
    gguf, cache = write_tiny_gguf(tmp_path / "tiny.gguf"), tmp_path / "cache"
    first = _bench_gguf(gguf, cache, tmp_path / "r")
    assert first.returncode == 0 and "dequantizing tiny.gguf" in said(first), first.stderr[-3000:]
    assert "de-quantizing GGUF tensors" not in first.stderr  # transformers' own bar: not under the command's lines
    [entry] = list((cache / "converted").iterdir())
    manifest = json.loads((entry / ".sweep-complete").read_text())["files"]
    assert manifest["model.safetensors"]["size"] == (entry / "model.safetensors").stat().st_size
    weights = entry / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    second = _bench_gguf(gguf, cache, tmp_path / "r")  # a later run: rebuilt, not broken
    assert second.returncode == 0, second.stderr[-3000:]
    assert "unexpected" not in second.stderr
    assert f"the conversion cache entry {entry} cannot be used ({weights} has" in said(second)
    assert "dequantizing tiny.gguf" in said(second)  # rebuilt, with a fresh manifest
    assert json.loads((entry / ".sweep-complete").read_text())["files"]["model.safetensors"]["size"] == (
        weights.stat().st_size
    )
    with open(weights, "r+b") as f:  # same size, other bytes: the recorded hash finds it
        f.seek(1000)
        f.write(b"\xff" * 64)
    third = _bench_gguf(gguf, cache, tmp_path / "r")
    assert third.returncode == 0 and "changed since it was written (sha256 differs)" in said(third)
    (entry / ".sweep-complete").write_text("ok\n")  # an entry an earlier version wrote: never verified
    fourth = _bench_gguf(gguf, cache, tmp_path / "r")
    assert fourth.returncode == 0 and "is not a manifest" in said(fourth) and "dequantizing" in said(fourth)
    fifth = _bench_gguf(gguf, cache, tmp_path / "r")
    assert fifth.returncode == 0 and "from the conversion cache" in said(fifth) and "dequantizing" not in said(fifth)
    assert read("trials", tmp_path / "r")["status"].to_list() == ["ok"]  # one trial id, its row replaced each time


def test_two_processes_loading_one_gguf_first_convert_it_once(tmp_path):
    """Two `sweep bench` processes started together on a machine whose conversion cache is empty (two workers of one
    sweep loading the model for the first time): one dequantizes, the other waits for it and reads its entry."""
    gguf, cache = write_tiny_gguf(tmp_path / "tiny.gguf"), tmp_path / "cache"
    commands = [_bench_gguf_command(gguf, cache, tmp_path / name) for name in ("a", "b")]
    procs = [subprocess.Popen(args, env=env, stderr=subprocess.PIPE, text=True) for args, env in commands]
    stderrs = [" ".join(p.communicate(timeout=300)[1].split()) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], stderrs
    converted = [s for s in stderrs if "dequantizing tiny.gguf" in s]
    assert len(converted) == 1, stderrs  # one conversion
    [other] = [s for s in stderrs if s not in converted]
    assert "from the conversion cache" in other, other  # the other read the entry the first wrote
    assert len(list((cache / "converted").iterdir())) == 1  # one entry
    rows = [read("trials", tmp_path / name).row(0, named=True) for name in ("a", "b")]
    assert rows[0]["status"] == rows[1]["status"] == "ok" and rows[0]["model_hash"] == rows[1]["model_hash"]


HOLD_CONVERSION = """
import sys
from pathlib import Path
from sweep.models import _cache
with _cache.converting(Path(sys.argv[1]), "tiny.gguf"):
    print("held", flush=True)
    sys.stdin.read()  # until the test closes it
"""


def test_a_loader_that_finds_the_conversion_locked_names_the_holder_and_waits_for_it(tmp_path, caplog):
    """A process holds the conversion of an entry; another that needs it says so in one line naming the holder's pid,
    and goes on only once the holder is done."""
    import threading

    from helpers.waiting import wait_for
    from sweep.models import _cache

    entry = tmp_path / "converted" / "entry"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_CONVERSION, str(entry)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "held"
    entered = threading.Event()

    def second():
        with _cache.converting(entry, "tiny.gguf"):
            entered.set()

    waiting = (
        f"tiny.gguf: another process on this machine (pid {holder.pid}) is converting it; waiting for it to finish"
    )
    with caplog.at_level("WARNING", logger="sweep.models._cache"):
        thread = threading.Thread(target=second)
        thread.start()
        wait_for(lambda: waiting in [r.getMessage() for r in caplog.records], "the waiting line")
        assert not entered.is_set()  # the holder still holds it
        holder.stdin.close()
        assert holder.wait(timeout=60) == 0
        thread.join(timeout=60)
    assert entered.is_set()


def test_a_trial_tune_gives_up_on_within_max_failures_runs_again_and_only_past_it_fails(ray_session, tmp_path):
    """Ray Tune can count one worker's death twice and stop a trial it was retrying (CI: one SIGKILL, two
    failures of one actor, sweep.max_failures=3, a failed row). Such a trial's settings without a row run
    again, one per Tune trial, on the real embedded Ray; only a trial past the allowance gets failed rows."""
    from conftest import TINY_SWEEP, compose
    from sweep.config.identity import trial_identity
    from sweep.orchestrate.driver import run_again
    from sweep.orchestrate.plan import plan_sweep, select_trials
    from sweep.orchestrate.ray.hub import Hub
    from sweep.orchestrate.writer import RowWriter

    args = [*TINY_SWEEP, f"results.root={tmp_path}", "search=saturation-grid", "sweep.max_failures=2"]
    p = plan_sweep(compose(*args), args)
    todo, _ = select_trials(p.grid_trials, {}, "cpu", str(tmp_path))
    writer = RowWriter(str(p.root), len(todo), p.base, p.run_id, p.name, "cpu")
    writer.gave_up({"trials": todo[:3]}, "the actor died", failures=2, allowed=2)  # within: nothing written
    assert not files("trials", tmp_path) and writer.retry == todo[:3]
    writer.gave_up({"trial": todo[3]}, "the actor died", failures=3, allowed=2)  # past it: its failed row
    assert read("trials", tmp_path)["status"].to_list() == ["failed"]
    hub = Hub()
    try:
        interrupted = run_again(p, ray_session.TuneCluster({"cpu": 1, "gpu": 0}, "cpu", hub), writer, False)
    finally:
        hub.close()
        writer.close()
    df = read("trials", tmp_path)
    assert not interrupted and writer.retry == [] and df.height == 4
    assert sorted(df["status"].to_list()) == ["failed", "ok", "ok", "ok"]
    ran = {r["trial_id"] for r in df.filter(df["status"] == "ok").iter_rows(named=True)}
    assert ran == {trial_identity(c, "cpu").id for t, c in p.grid_trials if t in todo[:3]}


def test_a_bundle_given_up_within_max_failures_runs_again_only_its_settings_without_a_row(tmp_path):
    from conftest import TINY_SWEEP, compose
    from sweep.orchestrate.plan import plan_sweep, select_trials
    from sweep.orchestrate.writer import RowWriter

    args = [*TINY_SWEEP, f"results.root={tmp_path}", "search=saturation-grid", "sweep.max_failures=2"]
    p = plan_sweep(compose(*args), args)
    todo, _ = select_trials(p.grid_trials, {}, "cpu", str(tmp_path))
    writer = RowWriter(str(p.root), len(todo), p.base, p.run_id, p.name, "cpu")
    writer.errored({"trial": todo[0]}, "the worker died")  # a row for the bundle's first setting
    writer.gave_up({"trials": todo[:3]}, "the actor died", failures=1, allowed=2)
    assert writer.retry == todo[1:3] and read("trials", tmp_path).height == 1
