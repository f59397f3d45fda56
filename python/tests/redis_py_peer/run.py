"""redis-py's own lock tests against the drop-ins (``make test-python-peer``).

Downloads the sdist of the installed redis-py version from PyPI (once: cached), takes its
``tests/test_lock.py`` and ``tests/test_asyncio/test_lock.py`` as they are, and runs them in a
directory of their own with this directory's fixtures (``conftest_sync.py``,
``conftest_asyncio.py``: a server with the module, and ``lock_class=RLockCompat`` /
``AsyncRLockCompat`` where the tests pass redis-py's ``Lock``). Each test's outcome is checked
against ``expected_differences.txt`` (tests that fail with the drop-in, each with its reason,
also named in python/README.md): a failure outside the list, or a listed test that passes (a
stale list), fails the run. Ends with a ``test result:`` line (a test passes when its outcome
is the expected one)."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
PYTHON = HERE.parents[1]
ROOT = PYTHON.parent
TESTS = ("tests/test_lock.py", "tests/test_asyncio/test_lock.py")
EXPECTED = HERE / "expected_differences.txt"
README = PYTHON / "README.md"


def sdist(version: str, cache: Path) -> Path:
    """The redis-py ``version`` sdist in ``cache`` (``pip download`` from the package index,
    which checks the file's hash, when missing)."""
    path = cache / f"redis-{version}.tar.gz"
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:"]
        cmd += ["--no-deps", "-d", str(cache), f"redis=={version}"]
        subprocess.run(cmd, check=True, timeout=600)
    if not path.exists():
        raise SystemExit(f"pip download left no {path}")
    return path


def prepare(archive: Path, run: Path) -> None:
    """A run directory: redis-py's two test files as shipped, this directory's fixtures."""
    shutil.rmtree(run, ignore_errors=True)
    (run / "tests" / "test_asyncio").mkdir(parents=True)
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            rel = member.name.split("/", 1)[-1]
            if rel in TESTS:
                src = tar.extractfile(member)
                assert src is not None
                (run / rel).write_bytes(src.read())
    for rel in TESTS:
        if not (run / rel).exists():
            raise SystemExit(f"{archive.name} has no {rel}")
    (run / "tests" / "__init__.py").write_text("")
    (run / "tests" / "test_asyncio" / "__init__.py").write_text("")
    shutil.copyfile(HERE / "conftest_sync.py", run / "tests" / "conftest.py")
    shutil.copyfile(HERE / "conftest_asyncio.py", run / "tests" / "test_asyncio" / "conftest.py")
    (run / "pytest.ini").write_text(
        "[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n"
        "markers =\n    onlynoncluster: redis-py's marker\n"
    )


def outcomes(junit: Path) -> dict[str, bool]:
    """Test id (``test_lock.py::TestLock::test_x``) -> passed, from pytest's JUnit XML."""
    found: dict[str, bool] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        module, _, cls = case.get("classname", "").rpartition(".")
        path = module.removeprefix("tests.").replace(".", "/") + ".py"
        bad = any(child.tag in ("failure", "error", "skipped") for child in case)
        found[f"{path}::{cls}::{case.get('name')}"] = not bad
    return found


def expected_differences() -> dict[str, str]:
    """The list: test id -> the reason it fails with the drop-in."""
    listed: dict[str, str] = {}
    for line in EXPECTED.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            test, _, reason = line.partition(" ")
            listed[test] = reason.strip()
    return listed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", type=Path, default=ROOT / "target" / "redis-py-peer")
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()
    version = importlib.metadata.version("redis")
    run = args.cache / f"run-{version}"
    prepare(sdist(version, args.cache), run)
    junit = run / "junit.xml"
    env = dict(os.environ, RLOCK_PEER_OUT=str(run))
    env["PYTHONPATH"] = os.pathsep.join(
        [str(PYTHON / "src"), str(PYTHON / "tests"), env.get("PYTHONPATH", "")]
    )
    env.setdefault("RLOCK_MODULE", str(ROOT / "target" / "release" / "librlock.so"))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE"]
    cmd += [f"--junitxml={junit}", *TESTS]
    print(f"redis-py {version}'s lock tests with RLockCompat / AsyncRLockCompat", flush=True)
    try:
        subprocess.run(cmd, cwd=run, env=env, timeout=args.timeout, check=False)
    except subprocess.TimeoutExpired:
        print(f"redis-py peer: pytest did not end within {args.timeout} s")
    if not junit.exists():
        print(
            "test result: FAILED. 0 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out "
            f"(redis-py {version} lock tests did not run)"
        )
        return 1
    found = outcomes(junit)
    listed = expected_differences()
    readme = README.read_text()
    problems: dict[str, list[str]] = {}
    for test, ok in sorted(found.items()):
        if test in listed and ok:
            problems.setdefault(test, []).append(f"passes but is listed in {EXPECTED.name}")
        elif test not in listed and not ok:
            problems.setdefault(test, []).append(f"fails and is not listed in {EXPECTED.name}")
    for test, reason in listed.items():
        if test not in found:
            problems.setdefault(test, []).append(f"is listed in {EXPECTED.name}, did not run")
        if not reason:
            problems.setdefault(test, []).append("is listed without a reason")
        name = re.sub(r"\[.*\]$", "", test.rsplit("::", 1)[-1])
        if f"`{name}`" not in readme:
            problems.setdefault(test, []).append(f"is listed, python/README.md lacks `{name}`")
    for test, said in problems.items():
        print(f"redis-py peer: {test} {'; '.join(said)}")
    failed = len(problems)
    passed = len(found) - sum(1 for t in problems if t in found)
    differ = sum(1 for t in found if t in listed and not found[t])
    status = "ok" if not problems else "FAILED"
    print(
        f"test result: {status}. {passed} passed; {failed} failed; 0 ignored; 0 measured; "
        f"0 filtered out (redis-py {version} lock tests, {differ} documented differences)"
    )
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
