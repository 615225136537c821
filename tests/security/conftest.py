"""Security suite: print the figures each test recorded and write them to an artifact."""

from __future__ import annotations

from typing import Any

from tests.security import figures


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: Any) -> None:
    if not figures.FIGURES:
        return
    terminalreporter.section("security figures")
    for line in figures.lines():
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"(written to {figures.ARTIFACT})")


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    figures.write_artifact()
