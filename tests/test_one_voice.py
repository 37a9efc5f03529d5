"""A job of 3 ranks reads like one process: one report of an error every rank raised together,
and a resumed job told when ``scatter_dataset`` gave it other shards.

The errors are the README's Quick start with one mistake each (a batch size that differs on
ranks 1 and 2; the multi-node evaluator registered on rank 0 only, so the ranks disagree), run
under mpiexec with stdout and stderr in the order written, as on a terminal: rank 0 prints the
report once, ranks 1 and 2 one line each pointing at it, and the job ends with status 1.
"""

import json
import os
import re
import sys

import pytest

from chainermn_comm import threads
from chainermn_comm.protocol import THREADS_ENV
from chainermn_comm.testing import find_mpiexec

from docs_support import block, run_in_session

pytestmark = pytest.mark.slow

ESCAPE = re.compile(r'\x1b\[\d*[AJ]')
#: Lines that come before any error (configuration, once) or belong to the reporter's table.
# Rank 0's configuration lines, the report's rows, and the tuner's decision (held while the report
# prints and written when the run ends, so present or not depending on when tuning finished).
QUIET = re.compile(r'^(chainermn:0: CPUModeWarning: .*|chainermn: \[rank 0 host [^\]]*\] (BLAS and OpenMP '
                   r'threads|oversubscribed|gradient averaging[^:]*): .*|'
                   r'epoch\s+main/loss.*|\d+\s+[0-9.]+\s.*)$')

MISTAKES = {
    'batch_size': (
        'train_iter = chainer.iterators.SerialIterator(train, 100)',
        'train_iter = chainer.iterators.SerialIterator(train, 100 if comm.rank == 0 else 50)',
        'ValueError', 'feed batches of different sizes to its first update (rank 0: 100, rank 1: 50, '
        'rank 2: 50)'),
    'evaluator_on_rank_0': (
        'trainer.extend(chainermn.create_multi_node_evaluator(evaluator, comm))',
        'if comm.rank == 0:\n    trainer.extend(chainermn.create_multi_node_evaluator(evaluator, comm))',
        'CommunicationError', 'ranks disagree on the next collective call:\n'
        '  rank 0: collective call #21: allgather_obj() on host'),
}


def _run(tmp_path, script, *args):
    path = tmp_path / 'train.py'
    path.write_text(script)
    cmd = [find_mpiexec(), '-n', '3', sys.executable, str(path)] + [str(a) for a in args]
    env = {k: v for k, v in os.environ.items() if k not in threads.POOL_VARIABLES + (THREADS_ENV,)}
    env.update(PYTHONUNBUFFERED='1', CHAINERMN_TIMEOUT='120')   # pools sized by the rule: one line
    return run_in_session(cmd, timeout=300, cwd=str(tmp_path), env=env, merge=True)


@pytest.mark.parametrize('mistake', sorted(MISTAKES))
def test_an_error_every_rank_raises_is_reported_once(tmp_path, mistake):
    old, new, kind, said = MISTAKES[mistake]
    script = block('quickstart').text
    assert old in script
    res = _run(tmp_path, script.replace(old, new, 1), '--epoch', 2, '--out', tmp_path / 'result')
    text = ESCAPE.sub('', res.stdout)
    report = 'status {} after {:.0f}s\n{}'.format(res.returncode, res.seconds, text)
    assert not res.timed_out and res.returncode == 1, report
    lines = [line for line in text.splitlines() if not QUIET.match(line)]
    # Before the error: the configuration said once, by rank 0 (warning, thread pools).
    quiet = [line for line in text.splitlines() if QUIET.match(line)]
    assert len(quiet) == len(set(quiet)), report
    assert sum('CPUModeWarning' in line for line in quiet) == 0, report   # quiet default (issue 54)
    assert sum('BLAS and OpenMP threads: ' in line for line in quiet) == 1, report
    crowded = bool(threads.oversubscription([threads.local_facts()] * 3))
    assert sum('oversubscribed: ' in line for line in quiet) == int(crowded), report
    # Rank 0's report: Chainer's, with the exception's type, once; its traceback once.
    first = lines.index('Exception in main training loop: {}: rank 0: '.format(kind) +
                        text.split('Exception in main training loop: {}: rank 0: '.format(kind))[1]
                        .splitlines()[0])
    last = lines.index('Will finalize trainer extensions and updater before reraising the exception.')
    assert said in '\n'.join(lines[first:last]), report
    assert text.count('Exception in main training loop') == 1 and text.count('Traceback') == 1, report
    assert text.count(said.splitlines()[0]) == 1, report
    # Ranks 1 and 2: one line each that points at it.
    pointers = sorted(re.findall(r'^chainermn: \[rank (\d) host [^\]]*\] {} in the main training loop, raised '
                                 r'by every rank together: rank 0 reports it$'.format(kind), text, re.M))
    assert pointers == ['1', '2'], report
    # Rank 0 ends the job, saying so once (and MPICH says it was aborted).
    assert sum('uncaught {} on rank 0; calling MPI_Abort(1)'.format(kind) in line for line in lines) == 1
    vendor = [line for line in lines if line.startswith('Abort(1) on node 0')]
    assert len(vendor) <= 1, report
    # Nothing else: the whole output is that report, two pointers and the end.
    assert len(lines) == (last - first + 1) + 2 + 1 + len(vendor), report
    assert last - first + 1 <= 40, report


RESUME = '''
import json, os, sys, warnings
import chainer, numpy
import chainermn
from chainermn_comm import run_facts

path, phase = sys.argv[1], sys.argv[2]
comm = chainermn.create_communicator('naive')
for seed in (None, 0):
    run_facts.clear()   # each loop stands for a program of its own
    data = numpy.arange(60, dtype=numpy.float32).reshape(30, 2) if comm.rank == 0 else None
    shard = chainermn.scatter_dataset(data, comm, shuffle=True, seed=seed)
    model = chainer.links.Linear(2, 2)
    opt = chainermn.create_multi_node_optimizer(chainer.optimizers.SGD(), comm)
    opt.setup(model)
    it = chainer.iterators.SerialIterator(shard, 5)
    updater = chainer.training.StandardUpdater(
        it, opt, loss_func=lambda x: chainer.functions.sum(model(x)))
    cp = chainermn.create_multi_node_checkpointer('r', comm, path=os.path.join(path, str(seed)))
    if phase == 'save':
        updater.update()
        cp.save(updater)
        continue
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        loaded = cp.maybe_load(updater, opt)
    sys.stdout.write('VOICE ' + json.dumps({'rank': comm.rank, 'seed': seed, 'loaded': loaded,
                                            'warnings': [str(w.message) for w in caught]}) + '\\n')
    sys.stdout.flush()   # one write: the ranks' lines do not mix
'''


def test_a_resumed_job_is_told_when_its_shards_differ(tmp_path):
    for phase in ('save', 'load'):
        res = _run(tmp_path, RESUME, tmp_path / 'ckpt', phase)
        assert not res.timed_out and res.returncode == 0, res.stdout
    got = {(o['seed'], o['rank']): o for o in
           (json.loads(line[6:]) for line in res.stdout.splitlines() if line.startswith('VOICE '))}
    assert set(got) == {(s, r) for s in (None, 0) for r in range(3)}, res.stdout
    for (seed, rank), o in got.items():
        assert o['loaded'] == 1, o
        shards = [w for w in o['warnings'] if 'the shards of this job differ' in w]
        if seed is None and rank == 0:   # shown once, by rank 0, naming the fix
            assert len(shards) == 1, o
            assert 'call 1 (30 samples, shuffle=True, seed=None' in shards[0], shards
            assert 'scatter_dataset(..., shuffle=True, seed=0)' in shards[0], shards
        else:
            assert shards == [], o
    assert res.stdout.count('the shards of this job differ') == 1, res.stdout
