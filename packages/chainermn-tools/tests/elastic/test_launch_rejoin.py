"""A host lost for a while rejoins the restart (``--rejoin-wait``); ignored tracebacks are no failure."""

import io
import threading
import types

import chainermn_tools.launch as launch
from chainermn_tools.launch import _attempt


def _args(**kw):
    base = dict(ranks_per_node=1, min_nodes=2, max_nodes=0, max_restarts=2, heartbeat=0, probe_timeout=1,
                bind_to='none', rejoin_wait=30.0)
    base.update(kw)
    return types.SimpleNamespace(**base)


def _run(monkeypatch, args, answers_b):
    """Attempt 1 loses host b; b answers the probes as ``answers_b`` says in turn; return (status, hosts, err)."""
    started = []
    attempts = [dict(status=1, lost={'b': 'no answer'}, failed_at=1.0), dict(status=0)]

    def run_attempt(base, hosts, ranks_per_node, command, env, heartbeat, probe_timeout, shown, lock,
                    on_start=None):
        started.append(list(hosts))
        att = _attempt.Attempt(hosts)
        for k, v in attempts.pop(0).items():
            setattr(att, k, v)
        return att

    replies = list(answers_b)

    def probe(base, hosts, timeout, env, cpus):
        out = {h: (True, 'ok') for h in hosts}
        if 'b' in hosts:
            out['b'] = (replies.pop(0), 'probe') if replies else (True, 'ok')
        return out

    monkeypatch.setattr(_attempt, 'run_attempt', run_attempt)
    monkeypatch.setattr(launch._hosts, 'probe', probe)
    status = launch.supervise(args, ['job'], ['mpiexec'], {}, lambda: ['a', 'b'], 'the list')
    return status, started


def test_a_host_back_after_its_link_was_down_rejoins_the_restart(monkeypatch, capsys):
    # b answers before the start; lost, it is not probed with a; it fails the first probe of the
    # wait (its link still down) and answers the next one.
    status, started = _run(monkeypatch, _args(), [True, False, True])
    err = capsys.readouterr().err
    assert status == 0, err
    assert started == [['a', 'b'], ['a', 'b']], err
    assert '1 of 2 host(s) answer, fewer than --min-nodes 2: probing every host again' in err, err
    assert 'host(s) b answer again' in err, err
    assert 'the job finished after 1 restart(s)' in err, err


def test_without_rejoin_wait_the_launch_gives_up_at_once(monkeypatch, capsys):
    status, started = _run(monkeypatch, _args(rejoin_wait=0), [True])
    err = capsys.readouterr().err
    assert status == 1 and started == [['a', 'b']], err
    assert '--min-nodes is 2: giving up' in err, err


def _pump(text):
    att = _attempt.Attempt(['a'])
    out = io.StringIO()
    pump = _attempt._Pump(io.BytesIO(text.encode()), out, att, set(), threading.Lock())
    pump.run()
    return att, out.getvalue()


IGNORED = ('Exception ignored in: <function ZipFile.__del__ at 0x7f>\n'
           'Traceback (most recent call last):\n'
           '  File "zipfile.py", line 1891, in close\n'
           'ValueError: seek of closed file\n')
RAISED = ('Traceback (most recent call last):\n'
          '  File "train.py", line 3, in <module>\n'
          'RuntimeError: boom\n')


def test_an_ignored_exception_is_not_the_attempts_exception():
    att, out = _pump('step 1\n' + IGNORED + 'step 2\n')
    assert att.exception is None, out
    assert 'ValueError: seek of closed file' in out and 'step 2' in out


def test_the_exception_after_an_ignored_one_is_the_attempts():
    att, out = _pump(IGNORED + RAISED)
    assert att.exception == 'RuntimeError: boom', out
