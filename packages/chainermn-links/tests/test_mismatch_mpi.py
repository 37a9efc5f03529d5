import os

from chainermn_comm.testing import run_mpi

HERE = os.path.dirname(__file__)
SCRIPT = os.path.join(HERE, 'mpi', 'script_mismatch.py')


def test_recv_without_send_is_aborted_by_watchdog():
    res = run_mpi([SCRIPT, 'deadlock'], 2, timeout=120, env={'CHAINERMN_TIMEOUT': '3'})
    assert not res.timed_out, res
    assert res.returncode != 0
    assert 'watchdog' in res.stderr
    assert 'recv' in res.stderr
    assert res.seconds < 60, res.seconds


def test_recv_of_wrong_kind_raises():
    res = run_mpi([SCRIPT, 'wrong_kind'], 2, timeout=120, env={'CHAINERMN_TIMEOUT': '30'})
    assert not res.timed_out, res
    assert 'CommunicationError: rank 1: recv(source=0, tag=0) got a Python object' in res.stdout, res
    assert 'rank 0 finished' in res.stdout
    assert res.returncode != 0
