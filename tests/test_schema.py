"""mpirl.logs.schema declares every HDF5 stream once; docs/hdf5.md must describe exactly those
streams and fields, with the same dtypes, units and text (no run needed: the files are written from
the same declarations, and tests/test_analysis.py checks a real run's files against the doc)."""

from pathlib import Path

import pytest

from analysis.schema import stream_table
from mpirl.logs import schema
from mpirl.logs.runlog import T_FIELD

DOC = Path(__file__).resolve().parents[1] / "docs" / "hdf5.md"
FILES = {
    "learner": "learner.h5",
    "learner_worker": "learner-<rank>.h5",
    "buffer": "buffer-<site>.h5",
    "actor": "actor-<rank>.h5",
}


def declared_tables(role: str) -> dict[str, str]:
    """Each stream of ``role`` as mpirl.logs.schema declares it (``t`` first, as the writer adds
    it), rendered as analysis.schema renders a file's streams (analysis never imports mpirl)."""
    return {
        s.name: "\n".join(
            stream_table(
                s.name,
                s.doc,
                [(f.name, f.dtype, f.shape, f.unit, f.doc) for f in (T_FIELD, *s.fields)],
            )
        )
        for s in schema.ROLES[role]
    }


def _doc_sections() -> dict[str, str]:
    text = DOC.read_text()
    return {sec.split("`")[1]: sec for sec in text.split("\n### ")[1:]}


@pytest.mark.parametrize("role", sorted(FILES))
def test_docs_describe_every_declared_stream_as_declared(role):
    section = _doc_sections()[FILES[role]]
    stale = [name for name, table in declared_tables(role).items() if table not in section]
    assert not stale, (
        f"docs/hdf5.md ({FILES[role]}) differs from mpirl.logs.schema for {stale}: "
        "run python -m analysis.schema RUN_DIR --update docs/hdf5.md"
    )


@pytest.mark.parametrize("role", sorted(FILES))
def test_docs_describe_no_stream_that_is_not_declared(role):
    section = _doc_sections()[FILES[role]]
    documented = {part.split("`")[0] for part in section.split("**`/")[1:]}
    assert documented == {s.name for s in schema.ROLES[role]}


def test_stream_fields_are_unique_and_t_is_left_to_the_writer():
    for role, streams in schema.ROLES.items():
        names = [s.name for s in streams]
        assert len(set(names)) == len(names), role
        for s in streams:
            fields = [f.name for f in s.fields]
            assert len(set(fields)) == len(fields) and "t" not in fields, (role, s.name)


@pytest.mark.parametrize("role", sorted(FILES))
def test_every_attribute_main_writes_is_documented(role, tmp_path):
    """main.py writes ``replay_at_auto_json`` into every rank's file under --replay-at auto:
    its meaning is in ATTR_DOCS, so the generated table does not say "(not documented here)"."""
    import h5py

    from analysis.schema import describe_file

    path = tmp_path / "x.h5"
    with h5py.File(path, "w") as f:
        f.attrs["replay_at_auto_json"] = '{"replay_at": "buffer"}'
    md = describe_file(path, role)
    assert "`replay_at_auto_json`" in md and "(not documented here)" not in md
