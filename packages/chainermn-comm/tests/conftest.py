"""Shared pytest configuration for chainermn-comm tests (also used when run outside the monorepo)."""


def pytest_configure(config):
    """Register the markers used here so the tests run the same in a standalone install."""
    config.addinivalue_line('markers', 'gpu: needs CuPy and a CUDA GPU (skipped otherwise)')
    config.addinivalue_line('markers', 'slow: takes more than a few seconds or a lot of memory')
