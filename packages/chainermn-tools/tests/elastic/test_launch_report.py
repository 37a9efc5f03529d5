"""The launcher's restart line counts redone work from what the failed attempt saved and reported."""

import re
import types

import chainermn_tools.launch as launch
from chainermn_tools.launch import _attempt


def _fake_attempts(monkeypatch, attempts):
    """Make the launcher run the given attempts in turn (no mpiexec), every host answering."""
    queue = list(attempts)

    def run_attempt(base, hosts, ranks_per_node, command, env, heartbeat, probe_timeout, shown, lock,
                    on_start=None):
        att = _attempt.Attempt(hosts)
        for k, v in queue.pop(0).items():
            setattr(att, k, v)
        return att

    monkeypatch.setattr(_attempt, 'run_attempt', run_attempt)
    monkeypatch.setattr(launch._hosts, 'probe', lambda base, hosts, timeout, env, cpus: {
        h: (True, 'ok') for h in hosts})


def _args():
    return types.SimpleNamespace(ranks_per_node=1, min_nodes=1, max_nodes=0, max_restarts=2, heartbeat=0,
                                 probe_timeout=1, bind_to='none')


def test_a_generation_saved_before_the_last_report_counts_as_reached(monkeypatch, capsys):
    """The failed attempt saved generation 10 and died before rank 0 reported iteration 10."""
    _fake_attempts(monkeypatch, [
        dict(status=1, last_iteration=9, failed_at=100.0),
        dict(status=0, generation=10, last_iteration=20, first_iteration_at=101.5, first_iteration_wall=5.0),
    ])
    assert launch.supervise(_args(), ['job'], ['mpiexec'], {}, lambda: ['a'], 'the list') == 0
    err = capsys.readouterr().err
    m = re.search(r'restart 1: generation (\d+) loaded; (\d+) iteration\(s\) redone \(the failed attempt '
                  r'reached iteration (\d+)\); training again ([0-9.]+) s after the failure', err)
    assert m, err
    assert m.groups() == ('10', '0', '10', '1.5'), err


def test_redone_work_is_counted_from_the_generation_loaded(monkeypatch, capsys):
    _fake_attempts(monkeypatch, [
        dict(status=1, last_iteration=13, failed_at=100.0),
        dict(status=0, generation=10, last_iteration=20, first_iteration_at=102.0, first_iteration_wall=5.0),
    ])
    assert launch.supervise(_args(), ['job'], ['mpiexec'], {}, lambda: ['a'], 'the list') == 0
    assert 'generation 10 loaded; 3 iteration(s) redone (the failed attempt reached iteration 13)' in \
        capsys.readouterr().err
