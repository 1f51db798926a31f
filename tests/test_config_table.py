"""docs/configuration.md's tables are generated from `Config`'s help strings (as docs/hdf5.md is
from mpirl.logs.schema): the committed text must be exactly what
mpirl.run.config_table writes now."""

import dataclasses
from pathlib import Path

import pytest

from mpirl.run import config_table
from mpirl.run.config import Config, build_parser

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def test_the_committed_configuration_table_is_the_generated_one():
    committed = config_table.generated_part(DOC.read_text())
    assert committed == config_table.markdown(), (
        "docs/configuration.md differs from Config's help strings: run "
        "python -m mpirl.run.config_table --update docs/configuration.md"
    )


def test_every_flag_of_the_parser_has_one_row():
    rows = [
        line.split("`")[1]
        for line in config_table.markdown().splitlines()
        if line.startswith("| `--")
    ]
    flags = [
        a.option_strings[0]
        for a in build_parser()._actions
        if a.option_strings and a.dest != "help"
    ]
    assert sorted(r.split()[0] for r in rows) == sorted(flags)
    assert len(config_table.groups()) > 1  # the group comments of Config's source were found
    grouped = [f.name for _, fs in config_table.groups() for f in fs]
    assert grouped == [f.name for f in dataclasses.fields(Config)]


def test_a_changed_help_string_shows_in_the_table(monkeypatch):
    text = config_table.markdown()
    field = next(f for f in dataclasses.fields(Config) if f.name == "batch_size")
    monkeypatch.setattr(field, "metadata", {**field.metadata, "help": "learner batch | size"})
    changed = config_table.markdown()
    assert changed != text and "| `--batch-size` | 64 | learner batch \\| size |" in changed


def test_help_text_becomes_a_safe_table_cell():
    assert config_table._cell("'ALE/<Game>-v5' or <x>, the learner's |td|") == (
        "`ALE/<Game>-v5` or &lt;x>, the learner's \\|td\\|"
    )
    assert [config_table.default_text(v) for v in (None, False, True, (64, 64), 0.25)] == [
        "-",
        "off",
        "on",
        "64 64",
        "0.25",
    ]


def test_update_rewrites_only_the_generated_part(tmp_path):
    doc = tmp_path / "c.md"
    doc.write_text(f"head\n{config_table.BEGIN}\nXYZZY\n{config_table.END}\ntail\n")
    config_table.update_doc(doc)
    text = doc.read_text()
    assert text.startswith("head\n") and text.endswith("tail\n") and "XYZZY" not in text
    assert config_table.generated_part(text) == config_table.markdown()
    doc.write_text("no markers")
    with pytest.raises(ValueError, match="markers"):
        config_table.update_doc(doc)
