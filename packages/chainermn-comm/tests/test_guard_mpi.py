import os

import pytest

from chainermn_comm.testing import run_mpi, run_pytest_under_mpi

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize('n', [1, 2, 3])
def test_guard_debug_mode(n):
    run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_guard.py'), n, timeout=240,
                         env={'CHAINERMN_DEBUG': '1'})


WATCHDOG_SCRIPT = '''
import sys, numpy, chainermn_comm
comm = chainermn_comm.create_communicator('naive', timeout=float(sys.argv[1]))
comm.bcast_obj(0)
# Both ranks wait for a message nobody sends (neither leaves, so no exit notice ends it first).
comm.recv(source=1 - comm.rank, tag=7)
'''


def test_watchdog_timeout_argument_names_the_call(tmp_path):
    script = tmp_path / 'stuck.py'
    script.write_text(WATCHDOG_SCRIPT)
    res = run_mpi([script, '2'], 2, timeout=60, env={'CHAINERMN_TIMEOUT': '1000'})
    out = res.stderr
    assert not res.timed_out, out
    assert res.returncode == 14, out
    assert 'rank 0 of 2: call #2 recv() [source=1, tag=7] has been blocked for 2.' in out, out
    assert '(timeout 2 s' in out and 'last completed call on this rank: call #1 bcast_obj(root=0)' in out
    assert 'stuck.py", line 6' in out, out
    assert res.seconds < 30, out


@pytest.mark.parametrize('n', [1, 2, 3])
def test_small_allreduce_fused_with_the_check(n):
    run_pytest_under_mpi(os.path.join(HERE, 'mpi', 'mpi_fused_allreduce.py'), n, timeout=240)


LATE_SCRIPT = '''
import time, numpy, chainermn_comm
comm = chainermn_comm.create_communicator('naive', timeout=1)
if comm.rank == 1:
    time.sleep(1.6)   # rank 0's watchdog fires at 1 s; the call then finishes during its grace
comm.allreduce(numpy.ones(2))
print('rank {} finished its program'.format(comm.rank))
'''


def test_the_watchdog_ends_the_job_as_it_says_even_when_the_call_then_finishes(tmp_path):
    """Once the watchdog printed 'MPI_Abort(14)' the job ends with 14, not 0 (CHAINERMN_TIMEOUT=1e-9 did)."""
    script = tmp_path / 'late.py'
    script.write_text(LATE_SCRIPT)
    res = run_mpi([script], 2, timeout=60, env={'CHAINERMN_TIMEOUT': None})
    out = res.stderr
    assert not res.timed_out, out
    assert 'then this rank ends the whole job with MPI_Abort(14) (exit status 14)' in out, out
    assert res.returncode == 14, (res.returncode, out)
