"""A bad --reference-set reaches every rank as one clear error (exit 2, no hang): a corrupt
file (zipfile.BadZipFile), or any error of the user's env code while rank 0 collects an
``auto`` set.  Before, only ValueError and OSError were caught around `refloss.resolve`; any
other error escaped on rank 0 before failure handling was installed, while the other ranks
waited in the Bcast of its verdict."""

import pytest
from mpirun import one_error, run_mpirl


@pytest.mark.mpi
def test_a_corrupt_reference_set_file_is_one_error(tmp_path):
    bad = tmp_path / "set.npz"
    bad.write_bytes(b"PK\x03\x04 not a zip file at all" * 10)
    p = run_mpirl(3, "--reference-set", str(bad), "--run-dir", str(tmp_path / "run"), timeout=60)
    err = one_error(p)
    assert f"reference_set={str(bad)!r}" in err and "BadZipFile" in err, err
    assert not (tmp_path / "run").exists()  # before the run folder is made


@pytest.mark.mpi
def test_the_users_env_failing_while_the_set_is_collected_is_one_error(tmp_path, tests_on_path):
    p = run_mpirl(
        3,
        "--reference-set", "auto", "--reference-size", "200",
        "--env-wrappers", "toy_refset:breaks_after_20",
        "--run-dir", str(tmp_path / "cell" / "run"),
        env=tests_on_path,
        timeout=60,
    )  # fmt: skip
    err = one_error(p)
    assert "reference_set='auto'" in err and "KeyError" in err and "the user's env broke" in err
