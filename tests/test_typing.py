"""Type hints are checked in CI (docs/style: "type hints checked in CI"): mypy, pinned in
pyproject's test extra, runs over mpirl/ in .ci/run; mypy only checks what is annotated, so
these tests keep mpirl's functions annotated."""

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
#: the least fraction of mpirl's functions whose parameters and return are all annotated
MIN_ANNOTATED = 0.95


def _functions() -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every def in mpirl/ (methods and nested functions too; lambdas are not defs)."""
    out = []
    for p in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((f"{p.relative_to(ROOT)}:{node.lineno} {node.name}", node))
    return out


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    """The parameters a caller passes: all but a leading self / cls."""
    a = fn.args
    params = [*a.posonlyargs, *a.args]
    if params and params[0].arg in ("self", "cls"):
        params = params[1:]
    return [*params, *a.kwonlyargs, *(x for x in (a.vararg, a.kwarg) if x is not None)]


def _fully_annotated(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return fn.returns is not None and all(p.annotation is not None for p in _parameters(fn))


def test_almost_every_function_in_mpirl_is_annotated():
    fns = _functions()
    bare = [where for where, fn in fns if not _fully_annotated(fn)]
    fraction = 1 - len(bare) / len(fns)
    assert fraction >= MIN_ANNOTATED, (
        f"{fraction:.3f} of mpirl's {len(fns)} functions are fully annotated, "
        f"must be >= {MIN_ANNOTATED}; not annotated: {bare}"
    )


def test_every_cfg_parameter_is_a_config():
    wrong = []
    for where, fn in _functions():
        for p in _parameters(fn):
            if p.arg != "cfg":
                continue
            ann = p.annotation
            text = ann.value if isinstance(ann, ast.Constant) else ast.unparse(ann) if ann else None
            if text not in ("Config", "mpirl.run.config.Config"):
                wrong.append(f"{where}: cfg: {text}")
    assert not wrong, f"a `cfg` parameter is annotated `Config`: {wrong}"


def test_the_annotation_counter_sees_what_is_missing():
    src = """
def a(x: int, *args: int, y: int = 0, **kw: int) -> int: ...
def b(self, x: int) -> None: ...
def c(x) -> None: ...
def d(x: int): ...
def e(self, *args) -> None: ...
def f(*, cfg: "Config") -> None: ...
"""
    fns = {n.name: n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef)}
    got = {name: _fully_annotated(fn) for name, fn in fns.items()}
    assert got == {"a": True, "b": True, "c": False, "d": False, "e": False, "f": True}
    assert [p.arg for p in _parameters(fns["b"])] == ["x"]


def test_ci_runs_the_mypy_pinned_in_pyproject():
    with open(ROOT / "pyproject.toml", "rb") as f:
        pyproject = tomllib.load(f)
    test_extra = pyproject["project"]["optional-dependencies"]["test"]
    pins = [r for r in test_extra if r.startswith("mypy")]
    assert len(pins) == 1 and re.fullmatch(r"mypy==[\d.]+", pins[0]), pins
    assert pyproject["tool"]["mypy"]["files"] == ["mpirl"]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    # after the README's install-and-test line, in the venv that line made and activated
    install = next(i for i, x in enumerate(ci) if x.endswith("&& python -m pytest -q || exit"))
    assert "mypy || exit" in ci[install + 1 : ci.index("deactivate")]
