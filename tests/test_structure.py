"""The layout keeps telling the architecture (docs/design.md, "Structure"): no import cycles in
mpirl/, and no function in mpirl/, bench/ or analysis/ long enough to hide a second concern (the
role loops are lists of named steps). The lint that CI runs is the one pre-commit runs."""

import ast
import functools
import importlib
import inspect
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
    """Module -> the mpirl modules it imports, at the top or inside a function (not under ``if
    TYPE_CHECKING:``: types only, no cycle at run time; e.g. ``cfg: Config`` in transport/link.py,
    whose profiles run/config.py imports)."""
    graph = {m: set() for m in mods}
    for m, p in mods.items():
        tree = ast.parse(p.read_text())
        typing_only = {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for b in node.body
            for n in ast.walk(b)
        }
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
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
                return path[path.index(w) :] + [w]
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
    assert "mpirl.replay.build" in graph["mpirl.roles.learner"]  # function-level imports count
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


# --- docs/design.md names code instead of quoting it: every name it gives must exist ----------
# A name is written without its subpackage (`Learner.turn`, `buffer.ForwardQueue`, `cut.py`,
# `replay.frames`), so moving a module between subpackages needs no edit here or there; a moved
# or renamed name fails this test until the doc names it as it is.

DESIGN = ROOT / "docs" / "design.md"
#: roots of dotted names that belong to other libraries (not checked)
EXTERNAL = {"torch", "np", "numpy", "h5py", "gymnasium", "gym", "mpi4py", "MPI", "zstandard"}
#: dotted spans that are file names, not Python names
FILE_SUFFIXES = {"h5", "pt", "json", "toml", "npz", "md", "csv", "png", "onnx", "sh"}
_DOTTED = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(.*\))?$")
_PATH = re.compile(r"^((?:tests|bench|analysis|experiments|jobs|docs)/[\w./-]+)(?:::(\w+))?$")


def _code_spans(text: str) -> list[str]:
    """The `...` spans of a markdown text outside ``` blocks."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.findall(r"`([^`\n]+)`", prose)


@functools.cache
def _module_for(prefix: str) -> list[str]:
    """mpirl modules named ``prefix`` (dotted, without ``mpirl.``), in any subpackage."""
    mods = _modules()
    exact = f"mpirl.{prefix}"
    if exact in mods:
        return [exact]
    depth = prefix.count(".") + 2  # mpirl.<subpackage>[.<subpackage>].<prefix>
    return sorted(m for m in mods if m.endswith("." + prefix) and m.count(".") >= depth)


@functools.cache
def _defined_in() -> dict[str, list[str]]:
    """Top-level class / function / constant name -> the mpirl modules that define it."""
    out: dict[str, list[str]] = {}
    for m, p in _modules().items():
        for node in ast.parse(p.read_text()).body:
            names = []
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                names = [node.name]
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
            for n in names:
                out.setdefault(n, []).append(m)
    return out


def _has_attr(obj: object, name: str) -> bool:
    """getattr, or for a class an instance attribute its methods assign (``self.name = ...``)."""
    if hasattr(obj, name):
        return True
    if inspect.isclass(obj):
        src = inspect.getsource(obj)
        return re.search(rf"self\.{name}\s*(?::[^=\n]+)?=[^=]", src) is not None
    return False


def resolve(name: str) -> str | None:
    """Why ``name`` (``module.Name``, ``Class.method``, ``module.py``) names nothing in mpirl,
    or None when it exists. Resolved by importing, so subpackages need not be written."""
    if name.endswith(".py"):
        found = _module_for(name[:-3].replace("/", "."))
        return None if len(found) == 1 else f"module {name}: {found or 'none'} under mpirl/"
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):  # the longest prefix that is a module
        found = _module_for(".".join(parts[:i]))
        if len(found) > 1:
            return f"{name}: {'.'.join(parts[:i])} is ambiguous ({found}); add its subpackage"
        if found:
            obj, rest = importlib.import_module(found[0]), parts[i:]
            break
    else:
        where = _defined_in().get(parts[0], [])
        if len(where) != 1:
            return f"{name}: {parts[0]} is defined in {where or 'no module'} of mpirl/"
        obj, rest = getattr(importlib.import_module(where[0]), parts[0]), parts[1:]
    for j, attr in enumerate(rest):
        if not _has_attr(obj, attr):
            return f"{name}: {'.'.join(parts[: len(parts) - len(rest) + j])} has no {attr}"
        if not hasattr(obj, attr):  # an instance attribute: nothing further to resolve
            return None if j == len(rest) - 1 else f"{name}: cannot resolve past {attr}"
        obj = getattr(obj, attr)
    return None


def names_in(text: str) -> tuple[list[str], list[str]]:
    """(code names, repository paths) named in a markdown text's code spans."""
    names, paths = [], []
    for span in _code_spans(text):
        if m := _PATH.match(span):
            paths.append(span)
        elif (m := _DOTTED.match(span)) and m.group(1).split(".")[0] not in EXTERNAL:
            if m.group(1).rsplit(".", 1)[1] not in FILE_SUFFIXES:
                names.append(m.group(1) if not span.endswith(".py") else span)
        elif re.fullmatch(r"(?:\w+/)*\w+\.py", span):
            names.append(span)
    return names, paths


def test_every_name_in_design_md_exists():
    names, paths = names_in(DESIGN.read_text())
    assert len(names) > 30 and "Learner.turn" in names  # the doc names its code
    missing = [why for n in sorted(set(names)) if (why := resolve(n))]
    for p in sorted(set(paths)):
        file, _, test = p.partition("::")
        if not (ROOT / file).is_file():
            missing.append(f"{p}: no such file")
        elif test and not re.search(rf"^def {test}\(", (ROOT / file).read_text(), re.M):
            missing.append(f"{p}: no test {test} in {file}")
    assert not missing, "docs/design.md names what does not exist:\n" + "\n".join(missing)


def test_design_md_links_stay_inside_the_repository():
    text = DESIGN.read_text()
    paths = re.findall(r"mpirl/\S+", text.replace("`mpirl/`", ""))
    assert not paths, f"name modules (`cut.py`, `cut.Cut`), not their paths: {paths}"
    for target in re.findall(r"\]\(([^)#]+)[^)]*\)", text):
        if "://" not in target:
            path = (DESIGN.parent / target).resolve()
            assert path.is_relative_to(ROOT) and path.exists(), target


def test_the_name_resolver_finds_what_is_missing():
    assert resolve("Learner.turn") is None and resolve("at_learner.ForwardQueue") is None
    assert resolve("replay.frames") is None and resolve("cut.py") is None
    assert resolve("TrainStep.sync") is None  # an instance attribute
    assert "has no" in resolve("Learner.no_such_step")
    assert "no module" in resolve("NoSuchClass.run")
    assert resolve("no_such_module.py") is not None
    assert names_in("`Learner.turn(now)`, `torch.optim.Adam`, `learner.h5`, `tests/x.py::t`") == (
        ["Learner.turn"],
        ["tests/x.py::t"],
    )


# --- the README's layout table names every module of mpirl/ -----------------------------------

README = ROOT / "README.md"


def readme_layout() -> dict[str, set[str]]:
    """The README's layout table: folder (``mpirl/roles/``) -> the module names it lists."""
    section = README.read_text().split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|") for line in section.splitlines() if line.startswith("| `mpirl/")]
    return {r[1].strip(" `"): set(re.findall(r"`(\w+)`", r[2])) for r in rows}


def module_folders() -> dict[str, set[str]]:
    """mpirl/'s folder listing: folder (``mpirl/replay/``) -> the modules in it."""
    out: dict[str, set[str]] = {}
    for p in PKG.rglob("*.py"):
        if p.stem != "__init__":
            out.setdefault(p.parent.relative_to(ROOT).as_posix() + "/", set()).add(p.stem)
    return out


def test_the_readme_layout_names_every_module():
    named = set().union(*readme_layout().values())
    missing = sorted(set().union(*module_folders().values()) - named)
    assert not missing, f"README.md's layout table lacks {missing}: add each to its folder's row"


# The README's layout table is the folder listing: a module moved or added shows here.
def test_the_readme_layout_is_the_folder_listing():
    table, folders = readme_layout(), module_folders()
    diff = {
        f: (
            sorted(folders.get(f, set()) - table.get(f, set())),
            sorted(table.get(f, set()) - folders.get(f, set())),
        )
        for f in sorted(set(table) | set(folders))
        if table.get(f) != folders.get(f)
    }
    assert not diff, f"folder: (modules missing from the table, listed but not there): {diff}"


def test_the_readme_main_flags_and_test_command_are_real():
    from mpirl.run.config import build_parser

    flags = {s for a in build_parser()._actions for s in a.option_strings}
    section = README.read_text().split("\n## Main flags\n", 1)[1].split("\n## ", 1)[0]
    named = re.findall(r"`(--[\w-]+)`", section)
    assert len(named) > 10 and not sorted(set(named) - flags), sorted(set(named) - flags)
    ci = (ROOT / ".ci" / "run").read_text()
    line = next(x for x in README.read_text().splitlines() if x.endswith("&& python -m pytest -q"))
    assert line in ci  # CI installs and tests exactly as the README says


def test_links_in_the_readme_and_docs_resolve():
    bad = []
    for doc in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)[^)]*\)", doc.read_text()):
            path = (doc.parent / target).resolve()
            if "://" not in target and not (path.is_relative_to(ROOT) and path.exists()):
                bad.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not bad, bad


def test_mpirl_never_imports_analysis():
    """The core does not depend on the analysis package (analysis may use mpirl.logs.dashboard)."""
    found = []
    for p in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            found += [
                f"{p.relative_to(PKG.parent)}: {n}"
                for n in names
                if n == "analysis" or n.startswith("analysis.")
            ]
    assert not found, f"mpirl imports analysis: {found}"


def test_main_docstring_diagram_names_every_message_kind():
    """mpirl/main.py's diagram is the one place that shows every message kind with its
    direction and flow control: a kind added to the wire must be added there."""
    from mpirl import main
    from mpirl.transport.wire import Tag

    missing = [k.name for k in Tag if not re.search(rf"\b{k.name}\b", main.__doc__)]
    assert not missing, f"kinds missing from mpirl/main.py's diagram: {missing}"


# ---- layers and the placements (docs/design.md, "Layers") --------------------------------------
#: package -> the mpirl packages and modules it must not import at run time (imports under
#: ``if TYPE_CHECKING:`` are types only and allowed: ``cfg: Config`` everywhere)
FORBIDDEN = {
    "mpirl.agent": ("mpirl.roles", "mpirl.run"),
    "mpirl.replay": ("mpirl.roles", "mpirl.run"),
    "mpirl.transport": ("mpirl.roles", "mpirl.run"),
    "mpirl.run": ("mpirl.roles",),
}
#: the commands and the wiring: no lower layer, nor run/, imports them
COMMANDS = (
    "mpirl.main",
    "mpirl.wiring",
    "mpirl.fakes",
    "mpirl.sweep",
    "mpirl.play",
    "mpirl.launch",
    "mpirl.placement",
    "mpirl.refloss",
    "mpirl.reference",
    "mpirl.advise",
)


def _runtime_imports(path: Path) -> set[str]:
    """The mpirl modules a file imports when it runs (top level or in a function), leaving out
    the ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text())
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(n) for b in node.body for n in ast.walk(b))
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.update(f"{node.module}.{a.name}" for a in node.names)
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m.startswith("mpirl")}


def _layer_violations(mods: dict[str, Path]) -> list[str]:
    bad = []
    for m, p in sorted(mods.items()):
        for pkg, banned in FORBIDDEN.items():
            if m != pkg and not m.startswith(pkg + "."):
                continue
            for imp in sorted(_runtime_imports(p)):
                if any(imp == b or imp.startswith(b + ".") for b in (*banned, *COMMANDS)):
                    bad.append(f"{m} imports {imp}")
    return bad


def test_lower_layers_import_no_higher_one():
    """agent/, replay/ and transport/ import nothing from roles/, run/ or the commands; run/
    nothing from roles/ or the commands."""
    bad = _layer_violations(_modules())
    assert not bad, "a lower layer imports a higher one:\n" + "\n".join(bad)


def test_the_layer_check_finds_an_upward_import(tmp_path):
    f = tmp_path / "x.py"
    f.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mpirl.run.config import "
        "Config\n\ndef f():\n    from mpirl.roles.learner import Learner\n"
    )
    assert _layer_violations({"mpirl.agent.x": f}) == [
        "mpirl.agent.x imports mpirl.roles.learner",
        "mpirl.agent.x imports mpirl.roles.learner.Learner",
    ]


#: names that say where the replay memory lives: only mpirl/roles/placements/ may use them
PLACEMENT_WORDS = re.compile(r"\b(replay_at|at_learner|at_buffer)\b")


def _placement_branches(files: list[Path]) -> list[str]:
    out = []
    for p in files:
        for node in ast.walk(ast.parse(p.read_text())):
            name = getattr(node, "id", None) or getattr(node, "attr", None)
            if isinstance(node, ast.Name | ast.Attribute) and PLACEMENT_WORDS.fullmatch(name):
                out.append(f"{p.name}:{node.lineno}: {name}")
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if PLACEMENT_WORDS.search(line) and not line.lstrip().startswith(("from", "import")):
                out.append(f"{p.name}:{i}: {line.strip()}")
    return sorted(set(out))


def test_no_role_branches_on_the_placement():
    """The wiring picks the placement (mpirl.roles.placements) once; a role that asks where
    the replay memory lives has grown a branch that belongs in a placement module."""
    roles = [p for p in (PKG / "roles").glob("*.py")]
    found = _placement_branches(roles)
    assert not found, "roles that branch on the placement:\n" + "\n".join(found)


def test_the_placement_check_finds_a_branch(tmp_path):
    f = tmp_path / "role.py"
    f.write_text("def train(cfg):\n    if cfg.replay_at == 'learner':\n        pass\n")
    assert _placement_branches([f])


def test_the_learner_is_small_and_nothing_else_writes_it():
    """`Learner` under 400 lines with no __init__ over 40 (its parts are handed in), and no
    module assigns to an attribute of an object it calls the learner or the lead
    (``lead.updates = ...``)."""
    tree = ast.parse((PKG / "roles" / "learner.py").read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Learner"]
    assert cls.end_lineno - cls.lineno + 1 < 400
    for node in ast.walk(cls):
        if isinstance(node, ast.FunctionDef):
            assert node.end_lineno - node.lineno + 1 <= 40, f"Learner.{node.name} is too long"
    writes = []
    for p in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            targets = getattr(node, "targets", None) or [getattr(node, "target", None)]
            for t in targets:
                if isinstance(t, ast.Attribute) and ast.unparse(t.value) in (
                    "lead",
                    "learner",
                    "lrn",
                    "self.lead",
                ):
                    writes.append(f"{p.relative_to(ROOT)}:{node.lineno}: {ast.unparse(t)}")
    assert not writes, "objects that write into the learner:\n" + "\n".join(writes)


def test_how_an_experience_travels_names_at_most_ten_modules_that_exist():
    """docs/design.md walks an experience from the env to the gradient step, once per
    placement, in at most 10 modules, each of which exists."""
    text = DESIGN.read_text().split("### How an experience travels", 1)[1].split("\nWhere to", 1)[0]
    walks = re.split(r"\n(?=Replay at the )", text.strip())
    assert [w.split(" (", 1)[0] for w in walks] == ["Replay at the learner", "Replay at the buffer"]
    for walk in walks:
        modules = set(re.findall(r"`(\w+)\.py`", walk))
        assert 3 <= len(modules) <= 10, (walk[:30], sorted(modules))
        missing = [m for m in sorted(modules) if resolve(f"{m}.py")]
        assert not missing, f"the walk names modules that do not exist: {missing}"


# --- analysis/: every helper is written once ----------------------------------------------------


def test_no_helper_is_defined_in_two_analysis_modules():
    """One ratio, one number formatter, one pairing of seeds, one reader of per-run rows: a
    module-level function or class of analysis/ is defined in one module only (each command's
    ``main`` aside), and the shared helpers live where the reports import them from."""
    where: dict[str, list[str]] = {}
    for p in sorted((ROOT / "analysis").glob("*.py")):
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                where.setdefault(node.name, []).append(p.stem)
    twice = {name: mods for name, mods in where.items() if len(mods) > 1 and name != "main"}
    assert not twice, f"defined in more than one analysis module: {twice}"
    home = {
        "ratio": "stats",
        "pair_by_seed": "stats",
        "log_ratio_t": "stats",
        "ratio_ci": "stats",
        "holm": "stats",
        "rmst_cell": "stats",
        "num": "tables",
        "field": "tables",
        "value": "tables",
        "read_rows": "tables",
        "by_cell": "tables",
    }
    assert {k: where.get(k) for k in home} == {k: [m] for k, m in home.items()}
    from analysis.tables import brief, num

    assert brief.func is num, "docs/results.md's number style is tables.num with its options"


def test_function_local_imports_are_extras_start_up_cost_or_mpi():
    """A function-local import of an mpirl module or a third-party one stays only for the
    reasons docs/design.md ("Layers") gives (optional extras, start-up cost, MPI); every other
    import is at the top of its module (the standard library's are not counted)."""
    # the optional extras (pyproject's images, tensorboard, video, export): absent from a plain
    # install, so imported where a run that asked for them uses them
    extras = {"ale_py", "minatar", "cv2", "zstandard", "tensorboard", "moviepy", "pygame", "onnx"}
    # start-up cost: torch ("Only the learner imports torch": the actors, buffers and a vector
    # run's evaluation process never pay for it) and gymnasium, imported where an env is made
    lazy = {"torch", "gymnasium"}
    allowed = {
        # mpirl modules that import torch at their top
        ("mpirl.agent.train_step", "mpirl.agent.dqn"),
        ("mpirl.refloss", "mpirl.agent.dqn"),
        # `mpirl play` runs without MPI, and imports mpirl.main, mpirl.run.resources and (through
        # mpirl.run.config) transport.link and transport.topology: mpi4py, and the modules that
        # import it at their top, only in the functions that use MPI
        ("mpirl.main", "mpi4py"),
        ("mpirl.main", "mpirl.wiring"),
        ("mpirl.run.resources", "mpi4py"),
        ("mpirl.transport.link", "mpi4py"),
        ("mpirl.transport.link", "mpirl.transport.inbox"),
        ("mpirl.transport.topology", "mpi4py"),
    }

    mods = _modules()

    def local_imports(tree: ast.AST) -> set[tuple[int, str]]:
        """(line, imported module) of the imports inside a def (a nested def's counted once)."""
        out = set()
        for fn in ast.walk(tree):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for node in ast.walk(fn):
                    if isinstance(node, ast.Import):
                        out.update((node.lineno, a.name) for a in node.names)
                    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                        for a in node.names:  # `from mpirl.run import checkpoint`: the module
                            full = f"{node.module}.{a.name}"
                            out.add((node.lineno, full if full in mods else node.module))
        return out

    def unjustified(module: str, tree: ast.AST) -> list[str]:
        bad = []
        for line, name in sorted(local_imports(tree)):
            root = name.split(".")[0]
            if root in sys.stdlib_module_names or root in extras | lazy:
                continue
            if (module, name) not in allowed and (module, root) not in allowed:
                bad.append(f"{module}:{line} imports {name} in a function")
        return bad

    sample = (
        "import numpy\n\ndef f():\n    import json, torch, numpy\n    from mpirl import seeds\n"
    )
    assert unjustified("mpirl.x", ast.parse(sample)) == [
        "mpirl.x:4 imports numpy in a function",
        "mpirl.x:5 imports mpirl.seeds in a function",
    ]
    bad = [b for m, p in sorted(mods.items()) for b in unjustified(m, ast.parse(p.read_text()))]
    assert not bad, "move these to the top of the module, or say here why not:\n" + "\n".join(bad)
