"""Collect each fault case's measured time to exit and print them at the end of the run."""

import pytest

_TIMES = []


@pytest.fixture
def record_exit():
    """Return ``record(case, seconds, note='')`` that stores a case's time to exit for the summary."""
    def record(case, seconds, note=''):
        _TIMES.append((case, seconds, note))
    return record


def pytest_terminal_summary(terminalreporter):
    if not _TIMES:
        return
    terminalreporter.section('fault injection: time to exit')
    for case, seconds, note in _TIMES:
        terminalreporter.write_line('{:<48} {:6.2f} s  {}'.format(case, seconds, note))
