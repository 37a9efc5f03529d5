"""The chainermn logger: rank and host in each record; users silence or redirect it the stdlib way."""

import logging
import pytest

from chainermn_comm import log
from chainermn_comm.testing import run_mpi


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def top():
    """The 'chainermn' logger, restored after the test."""
    logger = logging.getLogger(log.LOGGER_NAME)
    level, handlers = logger.level, list(logger.handlers)
    yield logger
    logger.setLevel(level)
    logger.handlers[:] = handlers


class _NoRootHandlers:
    """Remove the root logger's handlers (pytest adds its own around each test) for a block."""

    def __enter__(self):
        root = logging.getLogger()
        self.saved = list(root.handlers)
        root.handlers[:] = []

    def __exit__(self, *exc):
        logging.getLogger().handlers[:] = self.saved


@pytest.fixture
def no_root_handlers():
    return _NoRootHandlers()


def test_loggers_are_children_of_chainermn():
    assert log.get_logger('watchdog').name == 'chainermn.watchdog'
    assert log.get_logger().name == 'chainermn'


def test_default_handler_writes_rank_and_host_to_stderr(top, no_root_handlers, capfd):
    with no_root_handlers:
        log.get_logger('test').warning('something %s', 'happened')
    err = capfd.readouterr().err
    rank, host = log.rank_and_host()
    assert err == 'chainermn: [rank {} host {}] something happened\n'.format(rank, host), err


def test_records_carry_rank_and_host(top):
    got = _Collect()
    top.addHandler(got)
    log.get_logger('test').error('x')
    (record,) = got.records
    rank, host = log.rank_and_host()
    assert (record.rank, record.host) == (rank, host)
    assert record.name == 'chainermn.test' and record.getMessage() == 'x'


def test_a_user_handler_replaces_the_default_one(top, no_root_handlers, capfd):
    got = _Collect()
    top.addHandler(got)
    with no_root_handlers:
        log.get_logger('test').warning('to the user only')
    assert [r.getMessage() for r in got.records] == ['to the user only']
    assert capfd.readouterr().err == ''


def test_root_logging_configuration_replaces_the_default_handler(top, capfd):
    root = logging.getLogger()
    saved = list(root.handlers)
    got = _Collect()
    root.handlers[:] = [got]
    try:
        log.get_logger('test').warning('to the root handler')
    finally:
        root.handlers[:] = saved
    assert [r.getMessage() for r in got.records] == ['to the root handler']
    assert got.records[0].rank == log.rank_and_host()[0]
    assert capfd.readouterr().err == ''


def test_set_level_silences(top, no_root_handlers, capfd):
    top.setLevel(logging.CRITICAL)
    with no_root_handlers:
        log.get_logger('test').warning('hidden')
        log.get_logger('test').error('hidden too')
    assert capfd.readouterr().err == ''


STALL_SCRIPT = '''
import logging, os, sys, threading, time, numpy, chainermn_comm
marker = sys.argv[1]
if len(sys.argv) > 2 and sys.argv[2] == 'quiet':
    logging.getLogger('chainermn').setLevel(logging.CRITICAL)
comm = chainermn_comm.create_communicator('naive')
if comm.rank == 0:
    def tell_when_reported():   # the stall inspector has handed its report to the logger
        while comm._guard.watch.reported is None:
            time.sleep(0.02)
        open(marker, 'w').close()
    threading.Thread(target=tell_when_reported, daemon=True).start()
else:
    # Arrive only once rank 0's inspector (1 s threshold) has reported this rank missing.
    while not os.path.exists(marker):
        time.sleep(0.02)
sys.stdout.write('sum {}\\n'.format(comm.allreduce(numpy.ones(1))[0]))
'''


@pytest.mark.parametrize('quiet', [False, True])
def test_stall_report_goes_through_the_logger(tmp_path, quiet):
    script = tmp_path / 'stall.py'
    script.write_text(STALL_SCRIPT)
    res = run_mpi([script, tmp_path / 'reported'] + (['quiet'] if quiet else []), 2, timeout=120,
                  env={'CHAINERMN_STALL_SECONDS': '1', 'CHAINERMN_TIMEOUT': '100'})
    assert res.returncode == 0 and res.stdout.count('2.0') == 2, res
    if quiet:
        assert 'stall inspector' not in res.stderr, res.stderr
    else:
        assert 'chainermn: [rank 0 host ' in res.stderr, res.stderr
        assert '] *** chainermn stall inspector: rank 0 of 2' in res.stderr, res.stderr


def test_holding_keeps_information_until_the_hold_ends(top, no_root_handlers, capfd):
    rank, host = log.rank_and_host()
    with no_root_handlers:
        with log.holding():
            log.get_logger('tune').info('chosen %d', 1)
            with log.holding():                       # nested: only the outermost releases
                log.get_logger('tune').info('chosen %d', 2)
            assert capfd.readouterr().err == ''
            log.get_logger('watchdog').warning('a stall')  # warnings are written at once
            assert capfd.readouterr().err == 'chainermn: [rank {} host {}] a stall\n'.format(rank, host)
        err = capfd.readouterr().err
    assert err == ''.join('chainermn: [rank {} host {}] chosen {}\n'.format(rank, host, i)
                          for i in (1, 2)), err


def test_release_writes_what_was_held_and_holds_on(top, no_root_handlers, capfd):
    with no_root_handlers:
        with log.holding():
            log.get_logger('tune').info('first')
            log.release()
            assert capfd.readouterr().err.endswith('] first\n')
            log.get_logger('tune').info('second')
            assert capfd.readouterr().err == ''
        assert capfd.readouterr().err.endswith('] second\n')


def test_a_user_handler_gets_information_at_once_while_holding(top, no_root_handlers, capfd):
    got = _Collect()
    top.addHandler(got)
    with no_root_handlers, log.holding():
        log.get_logger('tune').info('now')
        assert [r.getMessage() for r in got.records] == ['now']
    assert capfd.readouterr().err == ''
