"""Fixtures for tests on a cluster of namespaces: skip (naming what is missing) where none can be made."""

import functools

import pytest

_TIMES = []


@functools.lru_cache(maxsize=None)
def _missing():
    from chainermn_tools.cluster import missing
    return tuple(missing(need_tc=True))


@pytest.fixture(scope='session', autouse=True)
def require_cluster():
    """Skip every test here, naming what is missing, when this machine cannot build a cluster."""
    problems = _missing()
    if problems:
        pytest.skip('cannot build a cluster of namespaces here; missing: ' + '; '.join(problems))


@pytest.fixture
def make_cluster():
    """Return ``make(nodes=2, **kwargs)`` that starts a Cluster, removed at the end of the test."""
    from chainermn_tools.cluster import Cluster
    made = []

    def make(nodes=2, **kwargs):
        cluster = Cluster(nodes=nodes, **kwargs).start()
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.close()


@pytest.fixture
def cluster2(make_cluster):
    """A 2-node cluster."""
    return make_cluster(2)


@pytest.fixture
def record_figure():
    """Return ``record(case, seconds, note='')`` that stores a measured figure for the run's summary."""
    def record(case, seconds, note=''):
        _TIMES.append((case, seconds, note))
    return record


def pytest_terminal_summary(terminalreporter):
    if _TIMES:
        terminalreporter.section('cluster of namespaces: measured figures')
        for case, seconds, note in _TIMES:
            terminalreporter.write_line('{:<52} {:8.2f}  {}'.format(case, seconds, note))
