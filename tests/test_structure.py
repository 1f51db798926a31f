"""The layout keeps telling the architecture (docs/design.md, "Structure"): no import cycles in
mpirl/, and no function in mpirl/, bench/ or analysis/ long enough to hide a second concern (the
role loops are lists of named steps). The lint that CI runs is the one pre-commit runs."""
import ast
import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "mpirl"
MAX_LINES = 100


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the mpirl modules it imports, at the top or inside a function."""
    graph = {m: set() for m in mods}
    for m, p in mods.items():
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    graph[m].add(full if full in mods else node.module)
            elif isinstance(node, ast.Import):
                graph[m].update(a.name for a in node.names)
        graph[m] = {x for x in graph[m] if x in mods and x != m}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the path, 2 done
    path: list[str] = []

    def visit(v):
        state[v] = 1
        path.append(v)
        for w in sorted(graph[v]):
            if state.get(w) == 1:
                return path[path.index(w):] + [w]
            if w not in state and (found := visit(w)):
                return found
        state[v] = 2
        path.pop()
        return None

    for v in sorted(graph):
        if v not in state and (found := visit(v)):
            return found
    return None


def test_no_import_cycles_in_mpirl():
    graph = _imports(_modules())
    assert "mpirl.replay.build" in graph["mpirl.learner"]  # function-level imports count
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_function_is_longer_than_a_screen_or_two():
    long = []
    for folder in ("mpirl", "bench", "analysis"):
        for p in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = node.end_lineno - node.lineno + 1
                    if n > MAX_LINES:
                        long.append(f"{p.relative_to(ROOT)}:{node.lineno} {node.name} ({n})")
    assert not long, f"functions over {MAX_LINES} lines: {long}"


def test_ci_and_pre_commit_run_the_ruff_pinned_in_pyproject():
    with open(ROOT / "pyproject.toml", "rb") as f:
        test_extra = tomllib.load(f)["project"]["optional-dependencies"]["test"]
    pins = [r for r in test_extra if r.startswith("ruff")]
    assert len(pins) == 1 and re.fullmatch(r"ruff==[\d.]+", pins[0]), pins
    version = pins[0].split("==")[1]
    pre_commit = (ROOT / ".pre-commit-config.yaml").read_text()
    assert re.search(r"ruff-pre-commit\n\s+rev: v" + re.escape(version) + r"\n", pre_commit)
    ci = (ROOT / ".ci" / "run").read_text()
    assert "ruff check ." in ci and "ruff format --check ." in ci
