"""Per-rank tests of the thread pools sized at communicator creation (run by test_threads_mpi.py).

The outer test says what to expect through ``CHAINERMN_TEST_THREADS`` (threads per pool; 0: left
as the libraries started them), ``CHAINERMN_TEST_THREADS_SOURCE`` (what decided) and
``CHAINERMN_TEST_THREADS_WARN`` (1: the oversubscription line is due).
"""

import logging
import multiprocessing
import os
import threading

import threadpoolctl
from mpi4py import MPI

import chainermn_comm
from chainermn_comm import threads

COMM = MPI.COMM_WORLD
EXPECT = int(os.environ['CHAINERMN_TEST_THREADS'])
SOURCE = os.environ['CHAINERMN_TEST_THREADS_SOURCE']
WARN = os.environ['CHAINERMN_TEST_THREADS_WARN'] == '1'
BEFORE = threads.pools()  # as the libraries started, before any communicator
#: Whether chainermn set the pools (else the user's OMP_NUM_THREADS & co did, or nobody).
CHOSEN = SOURCE in ('rule', 'CHAINERMN_THREADS') and EXPECT > 0


def _counts(info):
    return [p['num_threads'] for p in info if p.get('internal_api') == 'openblas' or
            p.get('user_api') in ('blas', 'openmp')]


def _want():
    return [n for _, _, n in BEFORE] if EXPECT == 0 else [EXPECT] * len(BEFORE)


def test_pools_follow_the_rule_or_the_user_and_rank_0_says_it_once(caplog):
    caplog.set_level(logging.INFO, logger='chainermn')
    assert BEFORE, 'no BLAS pool loaded: NumPy without OpenBLAS/MKL?'
    comm = chainermn_comm.create_communicator('naive')
    choice = threads.current()
    assert choice.source == SOURCE, choice
    assert choice.threads == (EXPECT if CHOSEN else None), choice
    assert [n for _, _, n in threads.pools()] == _want()
    mine = [r for r in caplog.records if r.name == 'chainermn.threads']
    warned = [r.getMessage() for r in mine if r.levelno == logging.WARNING]
    said = [r.getMessage() for r in mine if r.levelno == logging.INFO]
    if comm.rank == 0:
        assert len(warned) == WARN, warned
        assert all('oversubscribed' in w and '\n' not in w for w in warned), warned
        assert len(said) == (SOURCE == 'rule' and comm.size > 1), said
        assert all('{} per rank'.format(EXPECT) in s for s in said), said
    else:
        assert mine == [], [r.getMessage() for r in mine]
    # Later communicators of the job (a split, another on the world) keep the choice, say nothing.
    caplog.clear()
    sub = comm.split(comm.rank % 2, comm.rank)
    again = chainermn_comm.create_communicator('naive')
    assert [r for r in caplog.records if r.name == 'chainermn.threads'] == []
    assert threads.current() == choice and [n for _, _, n in threads.pools()] == _want()
    sub.finalize()
    again.finalize()
    comm.finalize()


def test_children_and_threads_start_with_the_same_pools():
    exported = {k: os.environ.get(k) or None for k in threads.POOL_VARIABLES if CHOSEN or k != SOURCE}
    assert set(exported.values()) == {str(EXPECT) if CHOSEN else None}, exported
    seen = []
    t = threading.Thread(target=lambda: seen.append(_counts(threadpoolctl.threadpool_info())))
    t.start()
    t.join()
    assert seen == [_want()]
    if not EXPECT or COMM.Get_rank() != 0:
        return  # the libraries' own default: nothing to inherit; children of one rank suffice
    # MultiprocessIterator's workers: forked (Python < 3.14) or from a forkserver (3.14).
    with multiprocessing.get_context('fork').Pool(1) as pool:
        assert _counts(pool.apply(threadpoolctl.threadpool_info)) == [EXPECT] * len(BEFORE)
    ctx = multiprocessing.get_context('forkserver')
    ctx.set_forkserver_preload(['numpy'])
    with ctx.Pool(1) as pool:
        assert _counts(pool.apply(threadpoolctl.threadpool_info)) == [EXPECT] * len(BEFORE)


def test_the_rule_counts_the_ranks_whose_cpus_overlap():
    f = threads.CpuFacts
    one = [f('m', 'h', 0b11, 2, None, False), f('m', 'h', 0b11, 2, None, False),
           f('x', 'g', 0b11, 2, None, False)]
    assert [threads.decide(one, r, {}).threads for r in range(3)] == [1, 1, 2]
    bound = [f('m', 'h', 0b0011, 4, None, False), f('m', 'h', 0b1100, 4, None, False)]
    assert [threads.decide(bound, r, {}) for r in range(2)] == [threads.ThreadChoice(2, 'rule', 2, 1)] * 2
    quota = [f('m', 'h', 0b1111, 4, 1, False)]
    assert threads.decide(quota, 0, {}).threads == 1
    assert threads.decide(quota, 0, {'CHAINERMN_THREADS': '3', 'OMP_NUM_THREADS': '1'}).threads == 3
    assert threads.decide(quota, 0, {'MKL_NUM_THREADS': '2'}) == threads.ThreadChoice(None, 'MKL_NUM_THREADS', 1, 1)
    # A variable chainermn exported is not the user's: a child process applies the rule again.
    assert threads.decide(quota, 0, {'OMP_NUM_THREADS': '4', 'CHAINERMN_THREADS_CHOSEN': '4'}).source == 'rule'
    assert threads.oversubscription(bound + one[2:]) == []
    over = [f('m', 'h', 0b01, 2, None, False), f('m', 'h', 0b10, 2, None, False), f('m', 'h', 0b01, 2, None, False)]
    assert threads.oversubscription(over) == [
        '3 ranks (0-2) share 2 CPUs, ranks 0,2 are bound to the same CPU (0) on h']
    assert threads.oversubscription([f('m', 'a', 0b1, 2, None, False), f('m', 'b', 0b1, 2, None, False)]) == [
        '2 ranks (0-1) share 1 CPU on a/b']
