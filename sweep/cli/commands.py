"""`sweep <command> [hydra overrides]`: a thin shell over the library.

Errors a user can fix print as one line on stderr with exit code 2 (bad input) or 1;
set SWEEP_DEBUG=1 to see tracebacks.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import errno
import signal
import sys
import warnings

from sweep.cli.help import HELP_FLAGS, QUIET_FLAGS, USAGE, flag_error, show_help
from sweep.errors import ConfigError, SweepError, unexpected
from sweep import progress
from sweep.textfit import WrappingFormatter, fit_lines


# the directories each command writes into (config keys; null ones are skipped): checked
# right after compose, before any model loads or Ray starts (`sweep calibrate` writes nothing)
OUTPUTS = {
    "profile": ("results.root",),
    "bench": ("results.root",),
    "run": ("results.root", "sweep.storage"),
    "analyze": ("results.root", "analysis.out"),
    "fit": ("fit.out",),  # results.root, where fit.out is null: `sweep fit`'s prepare, with its model's directory
}


def compose_for(command: str, overrides: list[str]):
    """The validated config of ``command``, its output directories checked writable (nothing created)."""
    from sweep.config import compose
    from sweep.config.paths import check_writable_dir

    cfg = compose(overrides)
    for key in OUTPUTS.get(command, ()):
        section, _, leaf = key.partition(".")
        path = getattr(getattr(cfg, section), leaf)
        if path is not None:
            check_writable_dir(key, path)
    return cfg


def _verb(command: str, *, breakdown: bool = False):
    """A command of four steps (``sweep.cli.verbs``): compose, then prepare, run, write, render; with
    ``breakdown`` the time breakdown's line last."""

    def handler(overrides: list[str]) -> int:
        from sweep.cli.verbs import VERBS

        cfg = compose_for(command, overrides)
        with progress.breakdown() as times:
            lines, code, _ = VERBS[command].execute(cfg)
        for line in lines + ([fit_lines(times.line())] if breakdown else []):
            print(line)
        return code

    return handler


def _run(overrides: list[str]) -> int:
    from sweep.orchestrate.ray.env import ray_environment
    from sweep.config import check_sweep_name

    cfg = compose_for("run", overrides)
    check_sweep_name(cfg)
    ray_environment(cfg.cluster)  # before Ray is imported
    from sweep.orchestrate import interrupt
    from sweep.orchestrate.writer import overhead_summary
    from sweep.report.run_report import failures, sweep_report
    from sweep.orchestrate.driver import run_sweep

    with progress.breakdown() as times:
        outcome = run_sweep(cfg, overrides)
    if outcome.interrupted:
        print(sweep_report(outcome))
        how = interrupt.stopped_by()
        print(f"{how}: {interrupt.resume_line(overrides, outcome.name)}", file=sys.stderr)
        return 128 + interrupt.stop_signal()
    print(sweep_report(outcome, cfg.analysis, cfg.search.constraints.get("agreement")))
    summary = overhead_summary(outcome)
    if summary:
        print(fit_lines(summary))
    print(fit_lines(times.line()))
    failed = failures(outcome)
    if failed and failed == len(outcome.rows) + outcome.unrowed and not outcome.skipped:
        print(
            f"error: sweep {outcome.name}: no trial succeeded ({failed} failed; see their rows' error)", file=sys.stderr
        )
        return 1
    return 0


def _config(overrides: list[str]) -> int:
    import yaml

    from sweep.config import compose_dict, validate

    data = compose_dict(overrides)
    cfg = validate(data)
    for section, values in data.items():  # each value as every command uses it: paths read, defaults resolved
        validated = getattr(cfg, section, None)
        if not isinstance(values, dict) or not dataclasses.is_dataclass(validated):
            continue
        for leaf, value in values.items():
            used = getattr(validated, leaf, value)
            if used != value and (used is None or isinstance(used, (str, int, float, bool))):
                values[leaf] = used
    print(yaml.safe_dump(data, sort_keys=False).rstrip())
    return 0


def _families(overrides: list[str]) -> int:
    from sweep.models import family_rows, family_table

    if overrides:
        raise ConfigError(f"sweep families takes no overrides (got {overrides[0]}): run it alone")
    print(family_table(family_rows()))
    return 0


def _schema(overrides: list[str]) -> int:
    from sweep.store import markdown

    if overrides:
        raise ConfigError(f"sweep schema takes no overrides (got {overrides[0]}): run it alone")
    print(markdown())
    return 0


COMMANDS = {
    "profile": _verb("profile"),
    "bench": _verb("bench", breakdown=True),
    "run": _run,
    "analyze": _verb("analyze"),
    "calibrate": _verb("calibrate"),
    "fit": _verb("fit"),
    "config": _config,
    "schema": _schema,
    "families": _families,
}


# commands that never load a model: they skip importing transformers to quiet it (and its import time)
NO_MODEL = ("analyze", "config", "schema")


def _quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore", category=UserWarning, module=r"transformers\..*")
    try:
        import transformers

        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
    except ImportError:
        pass


def main(argv: list[str] | None = None) -> int:
    try:
        code = _main(sys.argv[1:] if argv is None else argv)
        sys.stdout.flush()  # here, not at exit: a reader that went away (`| head -1`) is caught below
        return code
    except BrokenPipeError:  # the reader of stdout left (`sweep schema | head -1`): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except OSError as exc:  # the terminal went away (its SIGHUP stopped the command): nothing can be said on it
        if exc.errno != errno.EIO:
            raise
        from sweep.orchestrate import interrupt

        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.dup2(null, sys.stderr.fileno())
        return 128 + interrupt.stop_signal()


def _main(args: list[str]) -> int:
    quiet = any(a in QUIET_FLAGS for a in args)  # anywhere on the line: no progress display, no info lines
    args = [a for a in args if a not in QUIET_FLAGS]
    if not args or args[0] in HELP_FLAGS or args == ["help"]:
        print(USAGE, end="")
        return 0
    if args[0] == "help":
        return show_help(args[1], args[2:])
    command, overrides = args[0], args[1:]
    if command.startswith("-"):
        return flag_error(command, None)
    if command not in COMMANDS:
        print(f"error: unknown command '{command}'; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    if any(a in HELP_FLAGS for a in overrides):
        return show_help(command, [a for a in overrides if a not in HELP_FLAGS])
    flag = next((a for a in overrides if a.startswith("-")), None)
    if flag is not None:
        return flag_error(flag, command)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(WrappingFormatter("sweep: %(message)s"))  # lines within 120 columns
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, handlers=[handler])
    if command not in NO_MODEL:
        _quiet_libraries()
    from sweep.orchestrate import interrupt

    try:
        with progress.session(quiet), interrupt.sigterm_as_sigint():  # SIGTERM, SIGHUP: as Ctrl-C, one line
            return COMMANDS[command](overrides)
    except BrokenPipeError:
        raise
    except SweepError as exc:
        if os.environ.get("SWEEP_DEBUG"):
            raise
        print(f"error: {(str(exc).strip().splitlines() or [''])[0]}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:
        if exc.args and isinstance(exc.args[0], str):  # a sweep's resume line, as a sweep stopped in Tune says it
            print(f"{interrupt.stopped_by()}: {exc.args[0]}", file=sys.stderr)
        else:
            print(f"error: {interrupt.stopped_by()}", file=sys.stderr)
        return 128 + interrupt.stop_signal()
    except Exception as exc:  # a bug: one line plus where, the traceback on request
        if os.environ.get("SWEEP_DEBUG"):
            raise
        print(f"error: {unexpected(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
