"""Generates the sync package's await-only drivers from their asyncio source (``make
python-generate``; ``--check``: exit 1, writing nothing, when a generated file is stale).

Each asyncio file of ``SOURCES`` (in ``src/redis_rlock/``) is turned into its sync twin by
unasync (``async``/``await`` dropped, the names of ``REPLACEMENTS`` replaced, ``AsyncX`` ->
``SyncX``); a source in ``aio/`` has its package-relative imports moved one level up (``from
..`` -> ``from .``: the twin sits in the package, not in ``aio``); a header is added,
then ruff's import sorting and formatting applied (so the twin passes ``ruff check`` and
``ruff format --check`` as written)."""

from __future__ import annotations

import argparse
import difflib
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import unasync

PYTHON = Path(__file__).resolve().parent.parent
PACKAGE = PYTHON / "src" / "redis_rlock"

#: each generated file and the asyncio file it is generated from (relative to the package)
SOURCES = {
    "_drivers.py": "aio/_drivers.py",
    "_object_drivers.py": "aio/_object_drivers.py",
    "_compat_sync.py": "_compat_async.py",
}

#: names that differ between the two sides beyond unasync's own (``AsyncX`` -> ``SyncX``)
REPLACEMENTS = {
    "AsyncHold": "Hold",
    "AsyncSessionLink": "SessionLink",
    "AsyncCheck": "Check",
    "asyncio": "time",  # ``from asyncio import sleep`` -> ``from time import sleep``
    "aclose": "close",
    "_engine": "_sync",  # ``from ._engine import AsyncBackend``: the sync engine's module
}

HEADER = "# generated from {source} by `make python-generate`; do not edit\n"


def generate(name: str) -> str:
    """The generated file ``name`` as the generator makes it now from its source."""
    source = SOURCES[name]
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "aio" / name
        src.parent.mkdir()
        shutil.copyfile(PACKAGE / source, src)
        rule = unasync.Rule("/aio/", "/", additional_replacements=REPLACEMENTS)
        unasync.unasync_files([str(src)], [rule])
        text = (Path(tmp) / name).read_text(encoding="utf-8")
    if source.startswith("aio/"):
        text = re.sub(r"^from \.\.", "from .", text, flags=re.MULTILINE)
    text = HEADER.format(source=source) + text
    target = str(PYTHON / "src" / "redis_rlock" / name)  # ruff's settings: the package's
    for cmd in (["check", "--fix-only", "--select", "I,F401", "--quiet"], ["format"]):
        text = subprocess.run(
            [sys.executable, "-m", "ruff", *cmd, "--stdin-filename", target, "-"],
            input=text,
            capture_output=True,
            text=True,
            check=True,
            cwd=PYTHON,
        ).stdout
    return text


def stale() -> list[str]:
    """The generated files that differ from what the generator makes now, as diffs."""
    diffs = []
    for name in SOURCES:
        want = generate(name)
        path = PACKAGE / name
        have = path.read_text(encoding="utf-8") if path.exists() else ""
        if have != want:
            diff = difflib.unified_diff(
                have.splitlines(keepends=True),
                want.splitlines(keepends=True),
                f"{name} (in the tree)",
                f"{name} (generated now)",
            )
            diffs.append("".join(diff))
    return diffs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a file is stale")
    opts = parser.parse_args()
    if opts.check:
        diffs = stale()
        sys.stdout.write("".join(diffs))
        return 1 if diffs else 0
    for name in SOURCES:
        (PACKAGE / name).write_text(generate(name), encoding="utf-8")
        print(f"generated src/redis_rlock/{name} from src/redis_rlock/{SOURCES[name]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
