"""Fixtures for tests on a cluster of namespaces: the tools' own (one definition), loaded by path.

``require_cluster`` skips every test here, naming what is missing, where no cluster can be made;
``make_cluster``, ``cluster2`` and ``record_figure`` as in packages/chainermn-tools/tests/cluster.
"""

import importlib.util
import os

_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, 'packages',
                     'chainermn-tools', 'tests', 'cluster', 'conftest.py')
_spec = importlib.util.spec_from_file_location('chainermn_tools_cluster_fixtures', _PATH)
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)

require_cluster = _fixtures.require_cluster
make_cluster = _fixtures.make_cluster
cluster2 = _fixtures.cluster2
record_figure = _fixtures.record_figure
pytest_terminal_summary = _fixtures.pytest_terminal_summary
