"""One steady-state update stays short: at most 30 chainermn functions in at most 6 files (issue 50).

``mpi/update_path_job.py`` runs a 3-layer MLP at 2 ranks with default settings, 60 updates (the
tuner settles), then one ``optimizer.update`` under ``sys.setprofile``
(``chainermn_comm.testing.call_path``).  The tuner may settle on node-shared memory or on MPI
messages (it depends on the machine's load), so the same bounds are also checked with shared
memory pinned on.
"""

import os
import re

import pytest

from chainermn_comm.testing import run_mpi

HERE = os.path.dirname(__file__)
MAX_FUNCTIONS = 30
MAX_FILES = 6


@pytest.mark.parametrize('env', [{}, {'CHAINERMN_SHM_REDUCE': '1'}], ids=['default', 'shared-memory'])
def test_steady_update_path_is_short(tmp_path, env):
    listing = str(tmp_path / 'path.txt')
    r = run_mpi([os.path.join(HERE, 'mpi', 'update_path_job.py'), listing], 2, timeout=240, env=env)
    assert r.returncode == 0 and not r.timed_out, r.stderr[-5000:]
    found = re.findall(r'PATH rank (\d+): (\d+) functions, (\d+) calls, (\d+) files', r.stdout)
    assert sorted(int(rank) for rank, _, _, _ in found) == [0, 1], r.stdout
    with open(listing) as f:
        text = f.read()
    for rank, functions, _, files in found:
        assert int(functions) <= MAX_FUNCTIONS and int(files) <= MAX_FILES, \
            'rank {}: one update entered {} functions in {} files:\n{}'.format(rank, functions, files, text)
