"""The user-written communication hook of docs/communicators.md (``<!-- runnable: hook -->``) works.

The block is copied out verbatim and run at 2 ranks under mpiexec: both ranks train to the same
weights, the hook saw every update, and its state round-trips through the optimizer's serialize.
"""

import re

from chainermn_comm.testing import run_mpi

from docs_support import block


def test_user_hook_of_the_docs(tmp_path):
    script = tmp_path / 'hook_example.py'
    script.write_text(block('hook').text)
    res = run_mpi([str(script)], 2, timeout=180)
    report = 'status {}{}\n--- stdout ---\n{}\n--- stderr ---\n{}'.format(
        res.returncode, ' (TIMED OUT)' if res.timed_out else '', res.stdout[-4000:], res.stderr[-4000:])
    assert res.returncode == 0 and not res.timed_out, report
    # mpiexec merges the two ranks' output: a line may hold both ranks' reports, run together
    lines = re.findall(r'rank (\d): (\d+) updates averaged, saved (\d+), W\[0, 0\] = ([-+0-9.eE]+)', res.stdout)
    assert sorted(r for r, *_ in lines) == ['0', '1'], report
    assert {(u, s, w) for _, u, s, w in lines} == {(lines[0][1], lines[0][2], lines[0][3])}, report
    assert lines[0][1] == '5' and lines[0][2] == '5', report


def test_meta_package_exposes_the_hooks_and_the_argument():
    import inspect

    import chainermn
    import chainermn_comm.hooks
    assert chainermn.hooks.__name__ == 'chainermn.hooks' and 'hooks' in chainermn.__all__
    for name in chainermn_comm.hooks.__all__:
        assert getattr(chainermn.hooks, name) is getattr(chainermn_comm.hooks, name), name
    sig = str(inspect.signature(chainermn.create_multi_node_optimizer))
    # The documented arguments unchanged, comm_hook and shard_state added last with defaults.
    assert sig == ('(actual_optimizer, communicator, double_buffering=False, zero_fill=True, '
                   'overlap=False, check_finite=None, comm_hook=None, shard_state=False)'), sig
