"""Every CHAINERMN_* variable is read by one parser (chainermn_comm.settings), with one kind of error."""

import re
import warnings

import pytest

from chainermn_comm import protocol, settings
from chainermn_comm.testing import run_mpi


def _read(name, value):
    return settings.read(name, environ={} if value is None else {name: value})


@pytest.mark.parametrize('value,expected', [(None, True), ('', True), ('1', True), (' yes ', True),
                                            ('ON', True), ('0', False), ('false', False),
                                            ('no', False), ('off', False)])
def test_flag_with_default_true(value, expected):
    assert _read(protocol.CHECK_ENV, value) is expected


@pytest.mark.parametrize('value,expected', [(None, False), ('1', True), ('true', True), ('0', False)])
def test_flag_with_default_false(value, expected):
    assert _read(protocol.DEBUG_ENV, value) is expected


@pytest.mark.parametrize('name', [protocol.CHECK_ENV, protocol.DEBUG_ENV, protocol.SHM_REDUCE_ENV,
                                  protocol.FORCE_ABORT_ENV, protocol.SLURM_PMI_FIX_ENV])
@pytest.mark.parametrize('value', ['abc', '2', 'enable'])
def test_flags_refuse_other_words(name, value):
    """Values that used to be taken silently (CHAINERMN_CHECK=abc, CHAINERMN_DEBUG=abc) now fail."""
    with pytest.raises(ValueError) as e:
        _read(name, value)
    text = str(e.value)
    assert text.startswith("{}={!r} is not understood: it takes 1 or 0".format(name, value)), text
    assert 'unset it for the default' in text, text


@pytest.mark.parametrize('value,expected', [(None, None), ('', None), ('auto', None), ('1', True),
                                            ('off', False)])
def test_tristate(value, expected):
    assert _read(protocol.CUDA_AWARE_ENV, value) is expected


def test_tristate_refuses_other_words():
    with pytest.raises(ValueError, match=r"CHAINERMN_CUDA_AWARE='maybe' is not understood: it takes "
                                         r"1 or 0 .*or auto/unset to detect"):
        _read(protocol.CUDA_AWARE_ENV, 'maybe')


def test_int():
    assert _read(protocol.RANKS_PER_NODE_ENV, None) is None
    assert _read(protocol.RANKS_PER_NODE_ENV, ' 2 ') == 2
    assert settings.read(protocol.CHUNK_BYTES_ENV, 4096, environ={}) == 4096  # the code's default
    for bad in ('zero', '0', '1.5', '-3'):
        with pytest.raises(ValueError, match=r"CHAINERMN_RANKS_PER_NODE='{}' is not understood: it "
                                             r"takes an integer from 1 to 65536".format(re.escape(bad))):
            _read(protocol.RANKS_PER_NODE_ENV, bad)


def test_float():
    assert _read(protocol.TIMEOUT_ENV, None) == 1800.0
    assert _read(protocol.TIMEOUT_ENV, '0') == 0.0            # 0: the watchdog is off
    assert _read(protocol.STALL_SECONDS_ENV, '2.5') == 2.5
    for bad in ('soon', '-1', 'nan', '1e-9', '0.5'):
        with pytest.raises(ValueError, match=r"CHAINERMN_TIMEOUT='{}' is not understood: it takes a "
                                             r"number >= 1, or 0 for off \(seconds a rank may "
                                             r"block".format(bad)):
            _read(protocol.TIMEOUT_ENV, bad)


@pytest.mark.parametrize('name,bad,takes', [
    (protocol.CHUNK_BYTES_ENV, '1', 'an integer from 64 to 1073741824'),
    (protocol.CHUNK_BYTES_ENV, '50000000000000', 'an integer from 64 to 1073741824'),
    (protocol.SHM_CHUNK_BYTES_ENV, '63', 'an integer from 64 to 1073741824'),
    (protocol.OVERLAP_BUCKET_BYTES_ENV, str(1 << 31), 'an integer from 64 to 1073741824'),
    (protocol.STALL_SECONDS_ENV, '0.01', 'a number >= 1, or 0 for off'),
    (protocol.UNRESPONSIVE_SECONDS_ENV, '-5', 'a number >= 1, or 0 for off'),
    (protocol.TRACE_EVENTS_ENV, '10', 'an integer from 1000 to 100000000'),
    (protocol.CHECK_FINITE_ENV, 'maybe', 'one of off, skip, raise'),
    (protocol.THREADS_ENV, '99999999999999999999', 'an integer from 0 to 65536'),
    (protocol.THREADS_ENV, '-1', 'an integer from 0 to 65536'),
    (protocol.THREADS_CHOSEN_ENV, str(1 << 40), 'an integer from 1 to 65536'),
])
def test_bounds_name_the_variable_and_what_it_takes(name, bad, takes):
    with pytest.raises(ValueError, match=r"^{}='{}' is not understood: it takes {} \(".format(
            name, bad, re.escape(takes))):
        _read(name, bad)
    with pytest.raises(ValueError, match=name):
        settings.check_environment({name: bad})


def test_bounds_keep_the_edges_and_the_off_value():
    assert _read(protocol.CHUNK_BYTES_ENV, '64') == 64
    assert _read(protocol.CHUNK_BYTES_ENV, str(1 << 30)) == 1 << 30
    assert _read(protocol.TIMEOUT_ENV, '1') == 1.0
    assert _read(protocol.UNRESPONSIVE_SECONDS_ENV, '0') == 0.0
    assert _read(protocol.UNRESPONSIVE_SECONDS_ENV, None) == 240.0


def test_every_number_has_bounds():
    """No size or time variable takes any number: each has a lower bound (and sizes an upper one)."""
    for var in protocol.VARIABLES.values():
        if var.kind in ('int', 'float'):
            assert var.minimum is not None, var.name
            if var.name.endswith('_BYTES'):
                assert var.maximum is not None, var.name


def test_choice():
    assert _read(protocol.OVERLAP_MODE_ENV, None) == ''
    assert _read(protocol.OVERLAP_MODE_ENV, 'Thread') == 'thread'
    with pytest.raises(ValueError, match=r"CHAINERMN_OVERLAP_MODE='fast' is not understood: it takes "
                                         r"one of thread, inline, end"):
        _read(protocol.OVERLAP_MODE_ENV, 'fast')


def test_text():
    assert _read(protocol.NODE_LOCAL_ENV, '/tmp/x') == '/tmp/x'
    assert _read(protocol.NODE_LOCAL_ENV, None) is None


def test_check_environment_raises_on_the_first_bad_value_and_warns_on_unknown_names():
    with pytest.raises(ValueError, match="CHAINERMN_DEBUG='abc'"):
        settings.check_environment({'CHAINERMN_CHECK': '1', 'CHAINERMN_DEBUG': 'abc'})
    with pytest.warns(settings.UnknownVariableWarning, match='CHAINERMN_TIMOUT .*Did you mean '
                                                            'CHAINERMN_TIMEOUT'):
        settings.check_environment({'CHAINERMN_TIMOUT': '5'})
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        settings.check_environment({'CHAINERMN_TEST_ANYTHING': 'x', 'PATH': '/bin',
                                    'CHAINERMN_TIMEOUT': '5'})


def test_readers_use_the_one_parser(monkeypatch):
    """The modules that read a variable raise the settings error, not one of their own."""
    from chainermn_comm import _topology
    from chainermn_comm.reduce import node_shared as _shm_reduce
    from chainermn_comm.guard import config
    from chainermn_comm.gpu import _cuda_aware
    cases = [(protocol.CHECK_ENV, 'abc', config.check_enabled),
             (protocol.DEBUG_ENV, 'abc', config.debug_enabled),
             (protocol.TIMEOUT_ENV, 'soon', lambda: config.resolve_timeout(None)),
             (protocol.STALL_SECONDS_ENV, '-1', config.resolve_stall_seconds),
             (protocol.SHM_REDUCE_ENV, 'abc', _shm_reduce._shm_enabled),
             (protocol.RANKS_PER_NODE_ENV, 'zero', _topology._simulated_node_size),
             (protocol.CUDA_AWARE_ENV, 'maybe', lambda: _cuda_aware.parse_override('maybe'))]
    for name, value, fn in cases:
        monkeypatch.setenv(name, value)
        with pytest.raises(ValueError, match=r'^{}={!r} is not understood'.format(name, value)):
            fn()
        monkeypatch.delenv(name)


SCRIPT = '''
import sys
import chainermn_comm
try:
    comm = chainermn_comm.create_communicator('naive')
except ValueError as e:
    sys.stderr.write('RANK-FAILED {}\\n'.format(e))
    raise
print('CREATED')
'''


@pytest.mark.parametrize('name,value', [(protocol.CHECK_ENV, 'abc'), (protocol.DEBUG_ENV, 'abc')])
def test_bad_value_fails_at_start_up_on_every_rank(tmp_path, name, value):
    script = tmp_path / 'start.py'
    script.write_text(SCRIPT)
    res = run_mpi([script], 2, timeout=60, env={name: value})
    report = 'status {}\n--- stdout ---\n{}\n--- stderr ---\n{}'.format(res.returncode, res.stdout,
                                                                        res.stderr)
    assert not res.timed_out, report
    assert res.returncode != 0, report
    assert 'CREATED' not in res.stdout, report
    message = "{}={!r} is not understood: it takes 1 or 0".format(name, value)
    assert res.stderr.count('RANK-FAILED ' + message) == 2, report


def test_good_environment_starts(tmp_path):
    script = tmp_path / 'start.py'
    script.write_text(SCRIPT)
    res = run_mpi([script], 2, timeout=60, env={protocol.CHECK_ENV: 'yes', protocol.DEBUG_ENV: 'off'})
    assert res.returncode == 0 and res.stdout.count('CREATED') == 2, res


def test_out_of_range_threads_fail_at_start_up_on_every_rank(tmp_path):
    """CHAINERMN_THREADS=99999999999999999999 used to be taken (threadpoolctl's OverflowError on every rank)."""
    script = tmp_path / 'start.py'
    script.write_text(SCRIPT)
    res = run_mpi([script], 2, timeout=60, env={protocol.THREADS_ENV: '99999999999999999999'})
    report = 'status {}\n--- stdout ---\n{}\n--- stderr ---\n{}'.format(res.returncode, res.stdout,
                                                                        res.stderr)
    assert not res.timed_out and res.returncode != 0 and 'CREATED' not in res.stdout, report
    message = ("RANK-FAILED CHAINERMN_THREADS='99999999999999999999' is not understood: it takes an "
               "integer from 0 to 65536")
    assert res.stderr.count(message) == 2, report
    assert 'OverflowError' not in res.stderr, report


def _chainermn_imports(module):
    """Return the chainermn_comm modules ``module``'s source imports (lazy imports included)."""
    import ast
    import inspect
    found = set()
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.ImportFrom) and (node.module or '').startswith('chainermn_comm'):
            found.update('{}.{}'.format(node.module, a.name) if node.module == 'chainermn_comm' else node.module
                         for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith('chainermn_comm'))
    return found


def test_protocol_settings_and_safe_files_import_no_circle():
    """protocol: names only; settings reads protocol; safe_files uses both (the launch status file's
    I/O lives in launch_status, above them)."""
    from chainermn_comm import launch_status, safe_files
    assert _chainermn_imports(protocol) == set()
    assert _chainermn_imports(settings) == {'chainermn_comm.protocol'}
    assert _chainermn_imports(safe_files) == {'chainermn_comm.protocol', 'chainermn_comm.settings'}
    assert 'chainermn_comm.launch_status' not in _chainermn_imports(safe_files) | _chainermn_imports(settings)
    assert _chainermn_imports(launch_status) == {'chainermn_comm.protocol', 'chainermn_comm.safe_files',
                                                 'chainermn_comm.settings'}
