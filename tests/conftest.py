"""Fixtures shared by the tests.

- ``run_wire``: the wire a run of a configuration packs and unpacks with (mpirl.main builds the
  same one), for tests that drive a role in-process.
- The fake transport and the role builders wired to it live in ``fakes.py`` (a module, not
  fixtures, because bench/learner_loop.py uses them too): `fakes.ScriptedLink`,
  `fakes.RecordingPort`, `fakes.make_learner`, `fakes.make_buffer`, `fakes.make_actor`.
- ``tests_on_path``: the environment for a job that imports the tests folder's modules (the
  user's own env `toy_env`), on PYTHONPATH before what the caller had.

Markers (pyproject.toml): ``slow`` (left out by default) and ``mpi`` (starts mpirun jobs);
``python -m pytest -m "not slow and not mpi"`` runs the in-process tests alone.  A test that
uses one of the module fixtures in `MPI_FIXTURES` (each runs an mpirun job the module's tests
share) is marked ``mpi`` here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
#: module fixtures that start mpirun: test_play's and test_resume's ``trained``, test_resume's
#: ``resumed``, test_figures' ``two_sites``, test_analysis' ``experiment``
MPI_FIXTURES = frozenset({"trained", "resumed", "two_sites", "experiment"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if MPI_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.mpi)
    # Files with the most mpirun work first: the two xdist workers (`--dist loadfile`) take whole
    # files in this order, so the long MPI files start early and the short in-process ones fill
    # the end instead of one long file running alone on one worker. Within a file the order stays.
    mpi_tests: dict[str, int] = {}
    for item in items:
        n = 1 if item.get_closest_marker("mpi") else 0
        mpi_tests[item.nodeid.split("::")[0]] = mpi_tests.get(item.nodeid.split("::")[0], 0) + n
    items.sort(key=lambda item: -mpi_tests[item.nodeid.split("::")[0]])


@pytest.fixture
def run_wire() -> Callable:
    """``make(cfg, spec=None, role=None) -> (spec, wire)``: `fakes.wire_of`, the env spec and the
    rank's `mpirl.transport.wire.Wire` for ``cfg``, as mpirl.main builds them."""
    from mpirl.fakes import wire_of

    return wire_of


@pytest.fixture
def tests_on_path() -> dict[str, str]:
    """``{"PYTHONPATH": tests folder + what was there}``, for run_mpirl(..., env=...)."""
    return {
        "PYTHONPATH": os.pathsep.join(x for x in (str(TESTS), os.environ.get("PYTHONPATH")) if x)
    }
