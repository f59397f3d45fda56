"""The package type-checks under mypy --strict and is ruff clean (make test-python runs the
same tools first and sets RLOCK_PY_LINTED=1 so they are not run twice)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(
    os.environ.get("RLOCK_PY_LINTED") == "1", reason="already run by make test-python"
)


def _run(*args: str) -> None:
    out = subprocess.run([sys.executable, "-m", *args], cwd=PKG, capture_output=True, timeout=300)
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()


def test_mypy_strict() -> None:
    _run("mypy", "--strict", "src")


def test_ruff() -> None:
    _run("ruff", "check", "src", "tests")
    _run("ruff", "format", "--check", "src", "tests")
