"""Per-rank tests of the thread rule when the first communicator spans less than the job (run by
test_threads_first_mpi.py).

``CHAINERMN_TEST_FIRST``: ``self`` (the first communicator is on ``MPI.COMM_SELF``) or ``split``
(on ``COMM_WORLD.Split(rank % 2)``); ``CHAINERMN_TEST_THREADS``, ``..._SOURCE`` and ``..._WARN``
as in mpi_threads.py.
"""

import logging
import os

from mpi4py import MPI

import chainermn_comm
from chainermn_comm import threads

WORLD = MPI.COMM_WORLD
FIRST = os.environ['CHAINERMN_TEST_FIRST']
EXPECT = int(os.environ['CHAINERMN_TEST_THREADS'])
SOURCE = os.environ['CHAINERMN_TEST_THREADS_SOURCE']
WARN = os.environ['CHAINERMN_TEST_THREADS_WARN'] == '1'
BEFORE = threads.pools()
CHOSEN = SOURCE in ('rule', 'CHAINERMN_THREADS') and EXPECT > 0


def test_the_rule_counts_the_jobs_ranks_on_the_node_whatever_communicator_comes_first(caplog):
    caplog.set_level(logging.INFO, logger='chainermn')
    mpi = MPI.COMM_SELF if FIRST == 'self' else WORLD.Split(WORLD.Get_rank() % 2, WORLD.Get_rank())
    comm = chainermn_comm.create_communicator('naive', mpi_comm=mpi)
    choice = threads.current()
    assert choice.source == SOURCE, choice
    assert choice.threads == (EXPECT if CHOSEN else None), choice
    assert choice.sharing == WORLD.Get_size(), choice       # every rank of the job, on this node
    want = [n for _, _, n in BEFORE] if not CHOSEN else [EXPECT] * len(BEFORE)
    assert [n for _, _, n in threads.pools()] == want
    mine = [r for r in caplog.records if r.name == 'chainermn.threads']
    warned = [r.getMessage() for r in mine if r.levelno == logging.WARNING]
    said = [r.getMessage() for r in mine if r.levelno == logging.INFO]
    if WORLD.Get_rank() == 0:    # the job's rank 0 says it, once, whatever communicator it is in
        assert len(warned) == WARN, warned
        others = {'self': '0 and 2 more of the job', 'split': '0,2 and 1 more of the job'}[FIRST]
        assert all('oversubscribed: 3 ranks ({}) share'.format(others) in w for w in warned), warned
        assert len(said) == (SOURCE == 'rule'), said
        assert all('{} per rank'.format(EXPECT) in s and 'shared by 3 ranks' in s for s in said), said
    else:
        assert mine == [], [r.getMessage() for r in mine]
    comm.finalize()
    if FIRST == 'split':
        mpi.Free()


def test_the_launchers_count_and_the_unseen_ranks():
    env = {'MPI_LOCALNRANKS': '3'}
    assert threads.launcher_local_size(env) == 3
    assert threads.launcher_local_size({'OMPI_COMM_WORLD_LOCAL_SIZE': ' 4 '}) == 4
    assert threads.launcher_local_size({'SLURM_STEP_TASKS_PER_NODE': '2(x3)'}) == 2
    assert threads.launcher_local_size({'SLURM_STEP_TASKS_PER_NODE': '2(x2),1'}) is None
    for bad in ('x', '0', '-2', '99999999999999999999', ''):
        assert threads.launcher_local_size({'MPI_LOCALNRANKS': bad}) is None, bad
    f = threads.CpuFacts
    alone = [f('m', 'h', 0b11, 2, None, False, 3, 1)]        # COMM_SELF of world rank 1 of 3
    assert threads.decide(alone, 0, {}) == threads.ThreadChoice(1, 'rule', 2, 3)
    assert threads.oversubscription(alone) == ['3 ranks (1 and 2 more of the job) share 2 CPUs on h']
    unknown = [f('m', 'h', 0b11, 2, None, False, None, 1)]   # no launcher count: the communicator's
    assert threads.decide(unknown, 0, {}).threads == 2
    # The user's limits still win.
    assert threads.decide(alone, 0, {'CHAINERMN_THREADS': '2'}).threads == 2
    assert threads.decide(alone, 0, {'OMP_NUM_THREADS': '2'}).source == 'OMP_NUM_THREADS'
