"""The images extra's modules for tests/test_images*.py: skip those tests when the extra is not
installed, unless MPIRL_REQUIRE_IMAGES=1 (set by .ci/run), where an import that fails is an
error: in CI a broken or missing dependency must not turn the image tests into silent skips."""

from __future__ import annotations

import importlib
import os

import pytest

MODULES = ("zstandard", "ale_py", "cv2", "minatar")


def require() -> None:
    """Call at module level, before importing anything that needs the extra."""
    hard = os.environ.get("MPIRL_REQUIRE_IMAGES", "") not in ("", "0")
    for name in MODULES:
        if not hard:
            pytest.importorskip(name)
            continue
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - ImportError, or a module that breaks while importing
            pytest.fail(
                f"MPIRL_REQUIRE_IMAGES is set but {name} does not import "
                f'({type(e).__name__}: {e}); pip install -e ".[images]"',
                pytrace=False,
            )
