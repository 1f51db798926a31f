"""The configuration reference, generated from `Config`'s help strings (what ``--help`` prints).

    python -m mpirl.run.config_table                                  # print the markdown
    python -m mpirl.run.config_table --update docs/configuration.md   # rewrite its generated part

One table per group of `Config` (the ``# --- group ---`` comments in its source), one row per
flag: the flag, its default and its help text; then ``--resume`` and the link profiles.
``tests/test_config_table.py`` fails when docs/configuration.md differs from this output.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
from pathlib import Path

from mpirl.run.config import Config, build_parser
from mpirl.transport.link import PROFILES

BEGIN = "<!-- begin: python -m mpirl.run.config_table --update docs/configuration.md -->"
END = "<!-- end: python -m mpirl.run.config_table --update docs/configuration.md -->"

_GROUP = re.compile(r"^\s*# --- (.+?) -*$")
_FIELD = re.compile(r"^\s{4}(\w+):")


def groups() -> list[tuple[str, list[dataclasses.Field]]]:
    """`Config`'s fields in declaration order, under the group comment above each."""
    fields = {f.name: f for f in dataclasses.fields(Config)}
    out: list[tuple[str, list[dataclasses.Field]]] = []
    for line in inspect.getsource(Config).splitlines():
        if m := _GROUP.match(line):
            out.append((m.group(1), []))
        elif (m := _FIELD.match(line)) and m.group(1) in fields:
            out[-1][1].append(fields[m.group(1)])
    return out


def default_text(value: object) -> str:
    """A default as it is typed on the command line (`-` for none)."""
    if value is None or value == ():
        return "-"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return " ".join(map(str, value))
    return str(value)


_QUOTED = re.compile(r"(?<!\w)'([^']+?)'(?!\w)")
_CODE = re.compile(r"(`[^`]*`)")


def _cell(text: str) -> str:
    """Help text as a table cell: 'literal' -> `literal`, < escaped outside code, | escaped."""
    parts = _CODE.split(_QUOTED.sub(r"`\1`", text))
    return "".join(p if p.startswith("`") else p.replace("<", "&lt;") for p in parts).replace(
        "|", "\\|"
    )


def _row(flag: str, default: str, meaning: str) -> str:
    return f"| `{flag}` | {_cell(default)} | {_cell(meaning)} |"


def markdown() -> str:
    """Every flag of ``python -m mpirl.main``, grouped as in `Config`, as markdown tables."""
    lines: list[str] = []
    for name, fields in groups():
        title = name.split(" (")[0]
        lines += [
            f"### {title[0].upper()}{title[1:]}",
            "",
            "| flag | default | meaning |",
            "|---|---|---|",
        ]
        for f in fields:
            lines.append(
                _row("--" + f.name.replace("_", "-"), default_text(f.default), f.metadata["help"])
            )
        lines.append("")
    names = {f.name for f in dataclasses.fields(Config)}
    extra = [
        a
        for a in build_parser()._actions
        if a.dest not in names and a.dest != "help" and a.option_strings
    ]
    lines += ["### Continuing a run", "", "| flag | default | meaning |", "|---|---|---|"]
    lines += [_row(f"{a.option_strings[0]} {a.metavar}", "-", a.help or "") for a in extra]
    lines.append("")

    lines += ["### Link profiles (`--link`)", "", "| profile | link |", "|---|---|"]
    lines += [f"| `{k}` | {v.describe()} |" for k, v in PROFILES.items()]
    return "\n".join(lines)


def generated_part(text: str) -> str:
    """The text between the `BEGIN` and `END` markers (ValueError if they are missing)."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the markers {BEGIN} ... {END} are missing")
    return text[start + len(BEGIN) : end].strip("\n")


def update_doc(doc: str | Path) -> None:
    """Replace what lies between the markers of ``doc`` with `markdown`."""
    path = Path(doc)
    text = path.read_text()
    generated_part(text)  # raises if the markers are missing
    head, tail = text.split(BEGIN, 1)[0], text.split(END, 1)[1]
    path.write_text(f"{head}{BEGIN}\n{markdown()}\n{END}{tail}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m mpirl.run.config_table",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--update", metavar="DOC", help="write into DOC between its markers")
    a = ap.parse_args(argv)
    if a.update:
        update_doc(a.update)
    else:
        print(markdown())


if __name__ == "__main__":
    main()
