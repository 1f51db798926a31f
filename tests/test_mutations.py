"""tests/mutations.py stays runnable: every mutation's text is in its file exactly once (a
refactor that changes the line would otherwise stop the evidence run at that mutation), and
every test it names exists."""

from __future__ import annotations

from pathlib import Path

import pytest
from mutations import MUTATIONS, ROOT


@pytest.mark.parametrize("m", MUTATIONS, ids=[m.name for m in MUTATIONS])
def test_each_mutation_applies_once(m):
    text = (ROOT / m.path).read_text()
    assert text.count(m.old) == 1, f"{m.name}: {m.old!r} is in {m.path} {text.count(m.old)} times"
    assert m.new != m.old
    path = m.tests[0].split("::")[0]
    assert Path(ROOT / path).is_file(), path
