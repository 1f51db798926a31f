"""The layout keeps telling the architecture (docs/design.md, "Structure"): no import cycles in
mpirl/, and no function long enough to hide a second concern (the role loops are lists of named
steps)."""
import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "mpirl"
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


def test_no_function_in_mpirl_is_longer_than_a_screen_or_two():
    long = []
    for p in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_LINES:
                    long.append(f"{p.relative_to(PKG.parent)}:{node.lineno} {node.name} ({n})")
    assert not long, f"functions over {MAX_LINES} lines: {long}"


def test_main_docstring_diagram_names_every_message_kind():
    """mpirl/main.py's diagram is the one place that shows every message kind with its
    direction and flow control: a kind added to the wire must be added there."""
    import re

    from mpirl import main
    from mpirl.learner_group import GTag
    from mpirl.wire import Tag

    missing = [k.name for k in [*Tag, *GTag] if not re.search(rf"\b{k.name}\b", main.__doc__)]
    assert not missing, f"kinds missing from mpirl/main.py's diagram: {missing}"
