"""Shared by the Slurm tests: paths, polling with a deadline, checking the collectives job's output."""

import json
import os
import time

import pytest

__all__ = ['HERE', 'JOBS', 'TRAIN', 'wait', 'check_collectives']

HERE = os.path.dirname(os.path.abspath(__file__))
JOBS = os.path.join(HERE, 'jobs')
#: The fault-injection training job (checkpointer + preemption), reused under Slurm.
#: The cross-package training job of the root tests (tests/faults/jobs).
TRAIN = os.path.join(HERE, '..', '..', '..', '..', 'tests', 'faults', 'jobs', 'job_train.py')


def wait(cond, seconds, what):
    """Poll ``cond()`` until it returns a true value; fail naming ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail('timed out after {} s waiting for {}'.format(seconds, what))


def check_collectives(out, nodes, ranks, netmod, first=1):
    """Assert what jobs/collectives.py printed: layout and every value (nodes named from ``first``)."""
    lines = [line for line in out.splitlines() if line.startswith('RESULTS ')]
    assert len(lines) == 1, out
    rows = sorted(json.loads(lines[0][len('RESULTS '):]), key=lambda d: d['rank'])
    assert [d['rank'] for d in rows] == list(range(ranks)), out
    per_node = ranks // nodes
    assert sorted({d['host'] for d in rows}) == ['node{}'.format(i) for i in range(first, first + nodes)]
    tri = ranks * (ranks + 1) / 2
    for d in rows:
        assert d['size'] == ranks
        assert (d['inter_size'], d['intra_size']) == (nodes, per_node)
        assert d['intra_rank'] == d['rank'] % per_node and d['inter_rank'] == d['rank'] // per_node
        assert d['sum_ranks'] == ranks * (ranks - 1) // 2
        assert d['allreduce'] == [i * tri for i in range(4)]
        assert d['bcast_W'] == 7.0                       # rank 0's weights everywhere
        assert d['mean_grad'] == pytest.approx(tri / ranks)
        assert d['netmod'] == netmod
    assert sorted(v for d in rows for v in d['scatter']) == list(range(12))
