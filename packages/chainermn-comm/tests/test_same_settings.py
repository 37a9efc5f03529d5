"""The ranks agree on the settings that change what they send, when a communicator is made (``same_settings``)."""

import sys

import pytest

from chainermn_comm import protocol, same_settings
from chainermn_comm.testing import run_mpi

SCRIPT = '''
import os
import chainermn_comm
wire = os.environ.get('CHAINERMN_TEST_WIRE') or None
comm = chainermn_comm.create_communicator('naive', allreduce_grad_dtype=wire)
print('CREATED', comm.rank, flush=True)
comm.finalize()
'''
#: Every variable a probe set on one rank only (each used to hang or fail with MPI's message).
CASES = [(protocol.DEBUG_ENV, '1', '1', 'unset (default 0)'),
         (protocol.CHECK_ENV, '0', '0', 'unset (default 1)'),
         (protocol.TUNE_ENV, '0', '0', 'unset (default 1)'),
         (protocol.CHUNK_BYTES_ENV, '65536', '65536', 'unset'),
         (protocol.SHM_REDUCE_ENV, '1', '1', 'unset (default 1)'),
         (protocol.EXIT_NOTICE_ENV, '0', '0', 'unset (default 1)')]
CLEAN = {name: None for name in protocol.AGREED_VARIABLES}


def _mpmd(tmp_path, n, first_env, rest_env=(), wire=(None, None)):
    """Run SCRIPT as rank 0 with ``first_env`` and ranks 1..n-1 with ``rest_env``."""
    script = tmp_path / 's.py'
    script.write_text(SCRIPT)

    def part(env, dtype):
        args = []
        for k, v in env:
            args += ['-env', k, v]
        if dtype:
            args += ['-env', 'CHAINERMN_TEST_WIRE', dtype]
        return args
    rest = ['-n', str(n - 1)] + part(rest_env, wire[1]) + [sys.executable, str(script)]
    return run_mpi([str(script), ':'] + rest, 1, timeout=60, env=CLEAN,
                   mpiexec_args=part(first_env, wire[0]))


def _report(res):
    return 'status {} after {:.1f}s\n--- stdout ---\n{}\n--- stderr ---\n{}'.format(
        res.returncode, res.seconds, res.stdout, res.stderr)


@pytest.mark.parametrize('n', [2, 3])
@pytest.mark.parametrize('name,value,shown,unset', CASES, ids=[c[0] for c in CASES])
def test_a_setting_on_one_rank_only_ends_the_job_at_once_naming_it(tmp_path, n, name, value, shown,
                                                                    unset):
    res = _mpmd(tmp_path, n, [(name, value)])
    report = _report(res)
    assert not res.timed_out and res.seconds < 30, report
    assert res.returncode != 0 and 'CREATED' not in res.stdout, report
    others = 'rank 1' if n == 2 else 'ranks 1-2'
    line = '  {}: {} on rank 0; {} on {}\n'.format(name, shown, unset, others)
    assert res.stderr.count(line) == 1, report    # rank 0 reports it, once
    assert res.stderr.count('ValueError: the ranks differ in settings that change what they send:') == 1
    assert res.stderr.count('ValueError, raised by every rank together: rank 0 reports it') == n - 1, report


def test_several_differences_and_the_wire_are_named_together(tmp_path):
    res = _mpmd(tmp_path, 3, [(protocol.DEBUG_ENV, 'yes')],
                [(protocol.CHUNK_BYTES_ENV, '4096')], wire=('float16', None))
    report = _report(res)
    assert not res.timed_out and res.returncode != 0 and 'CREATED' not in res.stdout, report
    assert '  CHAINERMN_DEBUG: 1 on rank 0; unset (default 0) on ranks 1-2\n' in res.stderr, report
    assert '  CHAINERMN_CHUNK_BYTES: unset on rank 0; 4096 on ranks 1-2\n' in res.stderr, report
    assert ('  create_communicator(allreduce_grad_dtype=...): float16 on rank 0; None on ranks 1-2\n'
            in res.stderr), report
    assert 'pass the same allreduce_grad_dtype on every rank' in res.stderr, report


@pytest.mark.parametrize('n', [2, 3])
def test_the_same_values_spelled_differently_agree(tmp_path, n):
    res = _mpmd(tmp_path, n, [(protocol.CHECK_ENV, 'yes'), (protocol.DEBUG_ENV, 'off'),
                              (protocol.TUNE_ENV, '1')],
                [(protocol.CHECK_ENV, '1'), (protocol.EXIT_NOTICE_ENV, 'on')])
    assert res.returncode == 0 and res.stdout.count('CREATED') == n, _report(res)


def test_values_and_differences():
    env = {protocol.DEBUG_ENV: 'true', protocol.CHUNK_BYTES_ENV: '4096', protocol.TRACE_ENV: '/x'}
    mine = same_settings.values('float32', environ=env)
    assert mine[protocol.DEBUG_ENV] == (True, '1')
    assert mine[protocol.CHUNK_BYTES_ENV] == (4096, '4096')
    assert mine[protocol.TRACE_ENV] == (True, 'set')
    assert mine[same_settings.WIRE] == ('float32', 'float32')
    other = same_settings.values(None, environ={protocol.TRACE_ENV: '/elsewhere'})
    assert other[protocol.TRACE_ENV] == (True, 'set')      # where it writes may differ per rank
    assert other[protocol.CHECK_ENV] == (True, 'unset (default 1)')
    assert same_settings.differences([mine, mine, mine]) == []
    assert same_settings.differences([mine, other, mine]) == [
        'CHAINERMN_CHUNK_BYTES: 4096 on ranks 0,2; unset on rank 1',
        'CHAINERMN_DEBUG: 1 on ranks 0,2; unset (default 0) on rank 1',
        'create_communicator(allreduce_grad_dtype=...): float32 on ranks 0,2; None on rank 1']
    # Setting CHAINERMN_SHM_REDUCE pins the tuner's choice: set and unset differ even at the default.
    pinned = same_settings.values(None, environ={protocol.SHM_REDUCE_ENV: '1', protocol.TRACE_ENV: '/y'})
    assert same_settings.differences([pinned, other]) == [
        'CHAINERMN_SHM_REDUCE: 1 on rank 0; unset (default 1) on rank 1']
    assert same_settings.values('nonsense', environ={})[same_settings.WIRE][0] == "invalid 'nonsense'"
