"""Unit tests of the exit notice, the frozen-rank rule's bookkeeping and their texts (issue 41)."""

import subprocess
import sys

import pytest

from chainermn_comm.guard import departure, exit_status, report
from chainermn_comm.guard.call import Call
from chainermn_comm.guard.side_channel import SideChannel
from chainermn_comm.protocol import RANK_GONE_EXIT_STATUS


def notice(rank=1, collectives=20, failed=False, status=3, why='exited with status 3'):
    return {'rank': rank, 'host': 'h{}'.format(rank), 'why': why, 'status': status,
            'collectives': collectives, 'failed': failed}


def call(name='allreduce', number=21, start=0.0, **info):
    sig = (('shape', (4,)), ('dtype', '<f4'), ('op', 'sum')) if number else ()
    return Call.record(name, 30, sig, info, number, start)


@pytest.mark.parametrize('number,done,failed,blocks', [
    (21, 20, False, True),    # a collective the leaver never entered
    (20, 20, False, False),   # the leaver entered it: it completes
    (19, 20, False, False),
    (20, 20, True, True),     # the leaver left from inside it
])
def test_a_collective_waits_for_a_rank_that_left_fewer_collectives_ago(number, done, failed, blocks):
    departed = {1: (notice(collectives=done, failed=failed), 0.0)}
    found = departure.blocking(call(number=number), departed, now=100.0)
    assert (found is not None) == blocks
    if blocks:
        assert found[0] == 1


def test_a_point_to_point_call_with_the_leaver_gets_a_grace():
    departed = {2: (notice(rank=2), 10.0)}
    recv = call('recv', number=0, start=9.0, source=2, tag=3)
    assert departure.blocking(recv, departed, now=10.0 + departure.P2P_GRACE - 0.1) is None
    assert departure.blocking(recv, departed, now=10.0 + departure.P2P_GRACE)[0] == 2
    other = call('recv', number=0, start=9.0, source=1, tag=3)
    assert departure.blocking(other, departed, now=99.0) is None


@pytest.mark.parametrize('status,want', [(3, 3), (1, 1), (0, RANK_GONE_EXIT_STATUS),
                                         (None, RANK_GONE_EXIT_STATUS), (300, RANK_GONE_EXIT_STATUS)])
def test_the_job_ends_with_the_leaver_s_status(status, want):
    assert departure.job_status(notice(status=status)) == want


class _Guard:
    rank, host, size = 0, 'h0', 3


def test_the_gone_line_names_rank_host_why_and_call_numbers():
    line = departure.gone_line(_Guard(), call(number=21), notice(), 3)
    assert line == ('chainermn: rank 1 (host h1) exited with status 3 at collective call #20; rank 0 '
                    '(host h0) waits in collective call #21 allreduce(shape=(4,), dtype=<f4, op=sum), '
                    'which rank 1 will never join: ending the job with MPI_Abort(3)')
    inside = departure.gone_line(_Guard(), call(number=20), notice(failed=True), 3)
    assert 'exited with status 3 in its collective call #20;' in inside


@pytest.mark.parametrize('code,status', [(None, 0), (0, 0), (3, 3), (256, 1), (258, 2), (-1, 255),
                                         ('bye', 1), (True, 1)])
def test_status_of_sys_exit(code, status):
    assert exit_status.status_of(code) == status


LEAVING = '''
import atexit, sys
from chainermn_comm.guard import exit_status
exit_status.install()
def report():
    sys.stderr.write('LEAVING {!r} {!r} {!r}\\n'.format(*(exit_status.leaving() + (exit_status.exit_called(),))))
atexit.register(report)
BODY
'''


@pytest.mark.parametrize('body,status,why,called', [
    ('pass', None, 'ended (its program returned)', None),
    ('sys.exit(3)', 3, 'exited with status 3', 3),
    ('sys.exit()', 0, 'exited with status 0', 0),
    ("raise ValueError('bad\\nsecond line')", 1, 'exited with status 1 (uncaught ValueError: bad)', None),
    ('raise SystemExit(5)', 5, 'exited with status 5', 5),
    ('def f():\n    raise SystemExit(4)\nf()',) + (
        (4, 'exited with status 4', 4) if hasattr(sys, 'monitoring') else
        (None, 'exited (by a SystemExit whose status Python 3.11 cannot tell: '
               'sys.exit(n) keeps it)', None)),
    ('def f():\n    try:\n        raise SystemExit(4)\n    except SystemExit:\n        pass\nf()', None,
     'ended (its program returned)', None),
])
def test_leaving_says_how_the_program_ends(body, status, why, called):
    res = subprocess.run([sys.executable, '-c', LEAVING.replace('BODY', body)], stderr=subprocess.PIPE,
                         universal_newlines=True, timeout=60)
    assert 'LEAVING {!r} {!r} {!r}'.format(status, why, called) in res.stderr, res.stderr


def test_exit_status_wraps_sys_exit_once():
    before = sys.exit
    exit_status.install()
    wrapped = sys.exit
    exit_status.install()
    assert sys.exit is wrapped
    assert before is wrapped or wrapped is exit_status._exit


class _FakeSide:
    """A side channel without MPI: its bookkeeping of queries and answers."""
    first_asked = None
    _ask_times = []
    heard = {}
    silent_for = SideChannel.silent_for


def test_silence_counts_from_the_oldest_query_a_rank_left_unanswered():
    side = _FakeSide()
    side._ask_times = [10.0, 15.0, 20.0]
    side.heard = {1: 16.0}              # answered the query of 15 (or an older one) at 16
    assert side.silent_for(1, 30.0) == 10.0   # owes the query of 20
    assert side.silent_for(2, 30.0) == 20.0   # never answered: since the first query
    side.heard = {1: 25.0}
    assert side.silent_for(1, 30.0) == 0.0    # answered after the last query
    side._ask_times = []
    assert side.silent_for(2, 30.0) == 0.0    # nothing asked


def _answer(call, number, collectives, host='h2', pid=77):
    return {'host': host, 'pid': pid, 'collectives': collectives, 'call': call, 'number': number}


def test_the_stall_report_says_what_to_do():
    text = report.format_stall_report(report.Stall(
        0, 4, 'h0', 'call #5 allreduce()', 61, 5,
        {1: _answer('call #5 allreduce()', 5, 5, 'h1'), 2: _answer(None, 0, 4)}, 1800,
        'CHAINERMN_STALL_SECONDS', 'CHAINERMN_TIMEOUT', departed={}, unresponsive=240,
        unresponsive_env='CHAINERMN_UNRESPONSIVE_SECONDS'))
    assert ('***   ranks that have not reached it: rank 2 (host h2): last entered collective call #4, '
            'now not inside a chainermn call') in text
    assert '***   ranks that did not answer within 5 s' in text and 'rank 3' in text
    assert ('what to do: rank 2 answered, so it is alive (pid 77): if it is only slow' in text
            and 'py-spy dump --pid 77 on host h2' in text)
    assert ('what to do: rank 3 does not answer (frozen, stopped, killed, or its Python holds the GIL): '
            'if it stays silent for 240 s ($CHAINERMN_UNRESPONSIVE_SECONDS) this job ends') in text
    assert ('to end such a job sooner: $CHAINERMN_TIMEOUT=1800 ends any call that waits that long; '
            '$CHAINERMN_UNRESPONSIVE_SECONDS=240 ends a job whose rank stops answering') in text
    assert 'the watchdog ends the job with exit status 14 once this call has waited 1800 s' in text


def test_the_stall_report_names_ranks_that_ended():
    text = report.format_stall_report(report.Stall(
        0, 2, 'h0', 'call #5 allreduce()', 61, 5, {}, 0, 'CHAINERMN_STALL_SECONDS', 'CHAINERMN_TIMEOUT',
        departed={1: notice(collectives=5, status=0, why='ended (its program returned)')},
        unresponsive=0))
    assert '***   ranks that ended: rank 1 (host h1) ended (its program returned) at collective call #5' in text
    assert 'the watchdog is off' in text and 'did not answer' not in text


def test_the_unresponsive_line():
    line = report.unresponsive_line(0, 'h0', 2, 'h2', 241.3, 'collective call #9 allreduce()',
                                    'last entered collective call #9, in call #12 allreduce()',
                                    'CHAINERMN_UNRESPONSIVE_SECONDS', 15)
    assert line == ('chainermn: rank 2 (host h2) has not answered the stall inspector for 241 s '
                    '($CHAINERMN_UNRESPONSIVE_SECONDS): it is frozen, stopped, or holds the Python GIL; '
                    'its last answer: last entered collective call #9, in call #12 allreduce(); rank 0 '
                    '(host h0) waits in collective call #9 allreduce(): ending the job with MPI_Abort(15)')


def test_invalid_input_on_the_same_call_is_not_a_disagreement():
    everyone = [('gather_obj', (('root', 0),), 3, 'h0'),
                ('gather_obj', (('invalid input', 'CommunicationError: rank 1 (host h1): x.'),), 3, 'h1')]
    text = report.disagreement_message(0, 'the next collective call', everyone)
    assert text == ('rank 0: collective call #3 gather_obj fails on every rank because of invalid input '
                    'on rank 1 (host h1).\nInvalid input on rank 1: CommunicationError: rank 1 (host h1): '
                    'x.\n')
    assert report.DISAGREEMENT_HINT not in text


def test_reports_on_a_sub_communicator_name_world_ranks():
    world_of = [0, 2]   # the sub-communicator of world ranks 0 and 2
    text = report.format_stall_report(report.Stall(
        0, 2, 'h0', 'call #5 allreduce()', 61, 5, {1: _answer(None, 0, 4, 'h2')}, 0,
        world_of=world_of))
    assert text.startswith('*** chainermn stall inspector: rank 0 (rank 0 of 2 of the split communicator, '
                           'host h0) has waited 61 s in call #5 allreduce()')
    assert ('ranks that have not reached it: rank 2 (rank 1 of the split communicator, host h2): last '
            'entered collective call #4') in text
    assert 'what to do: rank 2 (rank 1 of the split communicator) answered, so it is alive' in text
    line = report.unresponsive_line(0, 'h0', 1, 'h2', 241.3, 'collective call #9 allreduce()', '',
                                    'CHAINERMN_UNRESPONSIVE_SECONDS', 15, world_of)
    assert line.startswith('chainermn: rank 2 (rank 1 of the split communicator, host h2) has not '
                           'answered the stall inspector for 241 s')
    assert '; rank 0 (rank 0 of the split communicator, host h0) waits in collective call #9' in line
    message = report.watchdog_message(1, 2, 'call #3 bcast()', '', 1801.0, 1800, 'CHAINERMN_TIMEOUT',
                                      'h2', 'none', 14, world_of)
    assert message.startswith('*** chainermn watchdog: rank 2 (rank 1 of 2 of the split communicator): '
                              'call #3 bcast() has been blocked')
