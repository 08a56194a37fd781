"""The package layout holds what the redesign promised, read from the code's own imports: no import
circle, no module over 400 lines, a short top of `sweep/`, no private name imported across packages,
and no behaviour switch read from the environment beyond the documented ones."""

from __future__ import annotations

import ast
from pathlib import Path

import sweep

SWEEP = Path(sweep.__file__).resolve().parent
MAX_LINES = 400
TOP = {
    "__init__.py",
    "errors.py",
    "progress.py",
    "textfit.py",
    "userfiles.py",
    "analysis",
    "bench",
    "tasks",
    "cli",
    "config",
    "decode",
    "gates",
    "models",
    "orchestrate",
    "report",
    "store",
    "trace",
}
# what `sweep/` may read from the environment: debugging, cache and state directories, the config
# directory, a job's provenance handed over by its submitter, and CI (progress bars off)
DOCUMENTED_ENV = {
    "SWEEP_DEBUG",
    "SWEEP_CACHE_DIR",
    "SWEEP_CONFIG_DIR",
    "SWEEP_STATE_DIR",
    "SWEEP_GIT_SHA",
    "SWEEP_SUBMISSION_ID",
}


def modules(root: Path = SWEEP) -> dict[str, ast.Module]:
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = ast.parse(path.read_text())
    return out


def imported(tree: ast.Module, known: set[str]) -> set[str]:
    """The project modules a module imports, anywhere in it (lazy imports in functions count too)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "sweep":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in known else node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
    return found & known


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def package(name: str) -> str:
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else name


def import_graph(root: Path = SWEEP) -> dict[str, set[str]]:
    trees = modules(root)
    known = set(trees)
    # a package's __init__ importing its own modules is its face, not a dependency loop
    return {
        name: {m for m in imported(tree, known) if not (m.startswith(name + ".") and name in known)}
        for name, tree in trees.items()
    }


def test_no_import_circle():
    assert circles(import_graph()) == []


def layers() -> list[list[str]]:
    """The package order docs/development.md writes once, lowest first: groups of packages."""
    doc = (SWEEP.parent / "docs" / "development.md").read_text()
    line = doc.split("<!-- layers:begin -->")[1].split("<!-- layers:end -->")[0].strip().strip("`")
    return [[f"sweep.{name.strip()}" for name in group.split(",")] for group in line.split("->")]


def upward_imports(graph: dict[str, set[str]], order: list[list[str]]) -> list[str]:
    """Every import of a package at or above the importer's place in ``order`` (a package that has no place
    is one too): ``importer -> imported``."""
    rank = {name: i for i, group in enumerate(order) for name in group}
    found = []
    for module, imports in sorted(graph.items()):
        src = package(module)
        if src == "sweep":
            continue
        for dst in sorted(package(m) for m in imports):
            if dst == src or dst == "sweep":
                continue
            if src not in rank or dst not in rank or rank[dst] >= rank[src]:
                found.append(f"{module} -> {dst}")
    return found


def test_packages_import_only_packages_below_them():
    order = layers()
    assert sorted(n for group in order for n in group) == sorted({package(m) for m in import_graph()} - {"sweep"})
    assert upward_imports(import_graph(), order) == []


def test_the_layer_check_finds_an_upward_import_and_a_package_out_of_place():
    order = [["sweep.errors"], ["sweep.gates"], ["sweep.config"]]
    graph = {"sweep.gates.spec": {"sweep.errors"}, "sweep.config._compose": {"sweep.gates", "sweep.errors"}}
    assert upward_imports(graph, order) == []
    graph["sweep.gates.base"] = {"sweep.config"}  # an import upwards
    graph["sweep.newpkg.x"] = {"sweep.errors"}  # a package with no place
    assert upward_imports(graph, order) == ["sweep.gates.base -> sweep.config", "sweep.newpkg.x -> sweep.errors"]
    # leaves of one group do not import each other either
    assert upward_imports({"sweep.a": {"sweep.b"}}, [["sweep.a", "sweep.b"]]) == ["sweep.a -> sweep.b"]


def test_the_circle_check_finds_a_circle():
    graph = {"sweep.a": {"sweep.b"}, "sweep.b": {"sweep.c"}, "sweep.c": {"sweep.a"}, "sweep.d": {"sweep.a"}}
    assert circles(graph) == [["sweep.a", "sweep.b", "sweep.c"]]


def test_no_module_over_400_lines():
    long = {
        str(p.relative_to(SWEEP)): n for p in SWEEP.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


def test_the_top_of_sweep_is_a_few_packages():
    entries = {p.name for p in SWEEP.iterdir() if p.name != "__pycache__"}
    assert entries == TOP


def test_no_private_name_is_imported_across_packages():
    found = []
    for name, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sweep."):
                if package(node.module) == package(name):
                    continue
                private = [a.name for a in node.names if a.name.startswith("_")]
                private += [node.module] if any(p.startswith("_") for p in node.module.split(".")[2:]) else []
                found += [f"{name}: {node.module} {p}" for p in private]
    assert found == []


def test_no_behaviour_switch_from_the_environment():
    found = set()
    for name, tree in modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("SWEEP_"):
                if node.value.isupper() and node.value not in DOCUMENTED_ENV:
                    found.add(f"{name}: {node.value}")
    assert found == set()


def test_no_test_file_imports_another():
    tests = Path(__file__).resolve().parent
    found = []
    for path in sorted(tests.glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            found += [f"{path.name}: {n}" for n in names if n.split(".")[0].startswith("test_")]
    assert found == []


def test_ray_lives_in_one_adapter_and_optuna_in_one_module():
    """Every import of Ray (Ray Tune, Ray Jobs) is in the one adapter package, every import of Optuna in one
    module, lazy ones included: the driver, the worker and the search kinds reach them through those."""
    found: dict[str, set[str]] = {"ray": set(), "optuna": set()}
    for name, tree in modules().items():
        for node in ast.walk(tree):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for imported_name in names:
                top = imported_name.split(".")[0]
                if top in found:
                    found[top].add(name)
    assert found["ray"] and all(m.startswith("sweep.orchestrate.ray.") for m in found["ray"]), found["ray"]
    assert found["optuna"] == {"sweep.orchestrate.searches.study"}
