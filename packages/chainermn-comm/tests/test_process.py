"""chainermn_comm.process: one place decides what is installed process-wide, and one switch leaves it out."""

import subprocess
import sys

import pytest

from chainermn_comm import process


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(process, '_state', {'alone': False, 'installed': [], 'asked': set()})
    monkeypatch.delenv(process.SWITCH, raising=False)


def test_install_runs_once_listed_and_the_switch_leaves_it_out(fresh, monkeypatch):
    ran = []
    assert process.install('Trainer.run', lambda: ran.append(1)) is True
    assert process.installed() == ['Trainer.run'] and ran == [1]
    assert process.install('excepthook', lambda: False) is True      # nothing to do: not listed
    assert process.installed() == ['Trainer.run']
    with pytest.raises(RuntimeError, match=r'leave_alone\(\) is called after chainermn installed '
                                           r'Trainer.run in this process; call it before the first '
                                           r'create_communicator \(or set CHAINERMN_PROCESS_WIDE=0'):
        process.leave_alone()
    with pytest.raises(KeyError, match='not a process-wide effect chainermn lists'):
        process.install('something new', lambda: None)
    monkeypatch.setenv(process.SWITCH, '0')
    assert process.left_alone()
    assert process.install('sys.exit', lambda: ran.append(2)) is False and ran == [1]
    assert process.install('thread pools', lambda: ran.append(3), asked=True) is True   # asked by name
    assert ran == [1, 3]


def test_leave_alone_before_anything_and_what_was_asked_for(fresh):
    process.install('abort hook', lambda: None, asked=True)       # CHAINERMN_FORCE_ABORT_ON_EXCEPTION=1
    process.leave_alone()
    process.leave_alone()
    assert process.left_alone()
    assert process.install('excepthook', lambda: pytest.fail('installed while left alone')) is False
    assert process.installed() == ['abort hook']


def test_a_bad_switch_is_said_by_the_environment_check(fresh, monkeypatch):
    monkeypatch.setenv(process.SWITCH, 'maybe')
    assert not process.left_alone()
    from chainermn_comm import settings
    with pytest.raises(ValueError, match="CHAINERMN_PROCESS_WIDE='maybe' is not understood"):
        settings.check_environment()


def test_importing_installs_nothing_but_what_is_asked_for():
    code = ('import sys; h = sys.excepthook; e = sys.exit; import chainermn_comm; '
            'from chainermn_comm import process; '
            'print(process.installed(), sys.excepthook is h, sys.exit is e)')
    out = subprocess.run([sys.executable, '-c', code], stdout=subprocess.PIPE, check=True,
                         env={'PATH': '/usr/bin:/bin'}, timeout=120).stdout.decode()
    assert out.strip() == '[] True True', out
    out = subprocess.run([sys.executable, '-c', code], stdout=subprocess.PIPE, check=True, timeout=120,
                         env={'PATH': '/usr/bin:/bin', 'CHAINERMN_FORCE_ABORT_ON_EXCEPTION': '1',
                              'CHAINERMN_PROCESS_WIDE': '0'}).stdout.decode()
    assert out.strip() == "['abort hook'] False False", out
