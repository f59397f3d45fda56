"""The checkers' own tests need no server; one summary line in the format CI sums."""

from typing import Any


def pytest_terminal_summary(terminalreporter: Any) -> None:
    stats = terminalreporter.stats
    passed = len(stats.get("passed", []))
    failed = len(stats.get("failed", [])) + len(stats.get("error", []))
    status = "ok" if failed == 0 else "FAILED"
    terminalreporter.write_line(
        f"test result: {status}. {passed} passed; {failed} failed; 0 ignored; "
        "0 measured; 0 filtered out (jepsen checkers)"
    )
