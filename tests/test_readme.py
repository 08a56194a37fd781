"""The README and docs/ as a user meets them: the README stays short, every `sweep ...` and `make ...`
command their code blocks show is one the project takes (composed in-process, no model run), an
`error:` line shown under a command is the error it gives, and every relative link resolves."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from conftest import ROOT

README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
SWEEP = ("sweep", ".venv/bin/sweep")
FENCE = re.compile(r"^```(\S*)\s*$")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def code_blocks(text: str) -> list[tuple[str, int, list[str]]]:
    """Each fenced block of a Markdown text: (its info string, its first line's number, its lines)."""
    blocks, lines, at = [], text.splitlines(), None
    for number, line in enumerate(lines, 1):
        fence = FENCE.match(line)
        if fence and at is None:
            at, info, body = number + 1, fence.group(1), []
        elif line.startswith("```") and at is not None:
            blocks.append((info, at, body))
            at = None
        elif at is not None:
            body.append(line)
    assert at is None, f"a code block opened at line {at - 1} is never closed"
    return blocks


def commands(page: Path) -> list[tuple[str, list[str], str | None]]:
    """Every `sweep`/`make` command in a page's shell blocks: (where, argv, the `error:` line shown under it)."""
    found = []
    for info, first, body in code_blocks(page.read_text()):
        if info not in ("", "bash", "sh", "console"):
            continue
        joined, numbers = [], []  # backslash continuations make one line
        for number, line in enumerate(body, first):
            if joined and joined[-1].endswith("\\"):
                joined[-1] = joined[-1][:-1] + " " + line.strip()
            else:
                joined.append(line)
                numbers.append(number)
        for i, (number, line) in enumerate(zip(numbers, joined)):
            text = line.strip().removeprefix("$ ")
            if not text.startswith((*(w + " " for w in SWEEP), "make ")) and text not in (*SWEEP, "make"):
                continue
            shown = joined[i + 1].strip() if i + 1 < len(joined) else ""
            expected = shown.removeprefix("error: ") if shown.startswith("error: ") else None
            argv = shlex.split(text, comments=True)
            parts = [[]]
            for word in argv:  # `a && b` is two commands
                parts.append([]) if word == "&&" else parts[-1].append(word)
            for part in parts:
                name = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page.name
                found.append((f"{name}:{number}", part, expected))
    return found


ALL = [c for page in PAGES for c in commands(page)]


def makefile() -> tuple[dict[str, list[str]], set[str]]:
    """The Makefile's targets with their recipe lines, and the variables it declares."""
    targets, variables, current = {}, set(), None
    for line in (ROOT / "Makefile").read_text().splitlines():
        if line.startswith("\t") and current is not None:
            targets[current].append(line.strip())
            continue
        current = None
        if m := re.match(r"^([A-Za-z_][A-Za-z0-9_]*)\s*[?:+]?=", line):
            variables.add(m.group(1))
        elif m := re.match(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", line):
            if not m.group(1).startswith("."):
                current = m.group(1)
                targets[current] = []
    return targets, variables


def compose_sweep(argv: list[str]) -> None:
    """What `sweep <command> [overrides]` composes before it does any work; ConfigError (or AssertionError)
    where the command line is not one the CLI takes."""
    from sweep.cli import COMMANDS, compose_for
    from sweep.cli.help import HELP_FLAGS, QUIET_FLAGS

    assert argv, "`sweep` with no command"
    command, words = argv[0], [w for w in argv[1:] if w not in QUIET_FLAGS and w not in HELP_FLAGS]
    if command in ("-h", "--help", "help"):
        return
    assert command in COMMANDS, f"unknown command {command!r}; commands: {', '.join(COMMANDS)}"
    assert not any(w.startswith("-") for w in words), f"sweep takes no such flag: {words}"
    if command in ("schema", "families"):
        assert not words, f"sweep {command} takes no overrides"
    else:
        compose_for(command, words)


def run_command(argv: list[str]) -> None:
    """Compose a shown command: `sweep ...` directly, `make T VAR=...` through T's recipe."""
    if argv[0] in SWEEP:
        compose_sweep(argv[1:])
        return
    assert argv[0] == "make"
    targets, variables = makefile()
    given = dict(w.split("=", 1) for w in argv[1:] if "=" in w)
    names = [w for w in argv[1:] if "=" not in w]
    assert names, "`make` with no target"
    unknown = [n for n in names if n not in targets]
    assert not unknown, f"no such Makefile target: {unknown}; targets: {', '.join(targets)}"
    assert set(given) <= variables, f"the Makefile declares no {sorted(set(given) - variables)}"
    for name in names:
        for recipe in targets[name]:
            if not recipe.startswith("$(BIN)/sweep "):
                continue
            words = []
            for word in shlex.split(recipe)[1:]:  # a variable expands to the words its value splits into
                var = re.fullmatch(r"\$\((\w+)\)", word)
                words += shlex.split(given.get(var.group(1), "")) if var else [word]
            compose_sweep(words)


@pytest.fixture(autouse=True)
def _plain_environment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative output directories resolve in a writable scratch directory
    monkeypatch.delenv("SWEEP_CONFIG_DIR", raising=False)  # the checkout's conf/


def test_the_readme_is_at_most_150_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; move reference prose into docs/"


def test_the_pages_show_the_commands_a_user_needs():
    readme = {" ".join(argv[:2]) for where, argv, _ in ALL if where.startswith("README.md")}
    assert {"make run", "make test"} <= readme
    shown = {argv[1] for where, argv, _ in ALL if where.startswith("README.md") and argv[0] in SWEEP}
    assert {"bench", "run", "analyze", "profile"} <= shown
    everywhere = {argv[1] for _, argv, _ in ALL if argv[0] in SWEEP}
    assert {"bench", "run", "analyze", "profile", "calibrate", "fit", "config", "schema", "families"} <= everywhere


@pytest.mark.parametrize("where, argv, expected", ALL, ids=[f"{w} {' '.join(a)[:60]}" for w, a, _ in ALL])
def test_every_shown_command_composes(where, argv, expected):
    from sweep.errors import ConfigError

    if expected is None:
        run_command(argv)
    else:  # the page shows the error this command gives: it must be the one the CLI prints
        with pytest.raises(ConfigError) as caught:
            run_command(argv)
        assert str(caught.value).splitlines()[0] == expected, f"{where}: the page shows another error"


def test_a_broken_command_is_caught(tmp_path):
    """The check can fail: a misspelt key, a wrong shown error, an unknown target, an undeclared variable."""
    from sweep.errors import ConfigError

    page = tmp_path / "page.md"
    page.write_text(
        "```bash\n"
        ".venv/bin/sweep bench gate=saturation gate.epz=0.2\n"
        "$ sweep profile gate=conformal gate.q=1.5\n"
        "error: gate.q=1.5: must be a number in (0, 1]\n"
        "make runn\n"
        "make run RUN_ARG=prompts.n=1\n"
        "make run RUN_ARGS=gate.eps=-1\n"
        "sweep families model=tiny-llama\n"
        "```\n"
    )
    (bench, _), (profile, shown), (target, _), (variable, _), (args, _), (families, _) = [
        (argv, exp) for _, argv, exp in commands(page)
    ]
    with pytest.raises(ConfigError, match="gate.epz"):
        run_command(bench)
    with pytest.raises(ConfigError) as caught:
        run_command(profile)
    assert str(caught.value) != shown  # the shown error is stale: the test above would fail on it
    with pytest.raises(AssertionError, match="no such Makefile target"):
        run_command(target)
    with pytest.raises(AssertionError, match="declares no"):
        run_command(variable)
    with pytest.raises(ConfigError, match="gate.eps=-1"):
        run_command(args)
    with pytest.raises(AssertionError, match="takes no overrides"):
        run_command(families)


def prose(text: str) -> str:
    """A Markdown text without its fenced code blocks."""
    kept, inside = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
        elif not inside:
            kept.append(line)
    return "\n".join(kept)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.+)$", prose(page.read_text()), re.MULTILINE)}


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_resolves(page):
    links = [m.group(1) for m in LINK.finditer(prose(page.read_text()))]
    broken = []
    for link in links:
        if re.match(r"^[a-z][a-z0-9+.-]*:", link):  # https:, mailto: ...
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{link}: no file {target}")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            broken.append(f"{link}: no heading #{anchor} in {target.name}")
    assert not broken, f"{page.name}: " + "; ".join(broken)
    if page == README:
        assert links, "the README links nowhere"


def test_the_readme_links_every_docs_page():
    linked = {(ROOT / m.group(1).partition("#")[0]).resolve() for m in LINK.finditer(README.read_text())}
    missing = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not missing, f"docs pages the README does not link: {missing}"


def test_the_configuration_page_names_every_experiment():
    from conftest import ROOT

    text = " ".join((ROOT / "docs" / "configuration.md").read_text().split())
    names = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))
    assert [n for n in names if f"`{n}`" not in text] == []
