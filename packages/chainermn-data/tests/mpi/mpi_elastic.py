"""create_elastic_iterator on every rank (run under mpiexec)."""

import numpy
import pytest

import chainermn_comm
from chainermn_comm import voice
from chainermn_data.iterators import create_elastic_iterator


def _comm():
    return chainermn_comm.create_communicator('naive')


def test_ranks_share_one_permutation_per_epoch():
    comm = _comm()
    n = 17
    it = create_elastic_iterator(list(range(n)), 2, comm)   # seed=None: rank 0's seed
    seeds = comm.allgather_obj(it.seed)
    assert len(set(seeds)) == 1
    pairs = []
    while it.epoch < 2:
        batch = next(it)
        pairs += list(zip(it.last_positions.tolist(), batch))
    everyone = sum(comm.allgather_obj(pairs), [])
    end = it.position
    assert sorted(p for p, _ in everyone) == list(range(end))
    for epoch in (0, 1):
        assert sorted(s for p, s in everyone if p // n == epoch) == list(range(n))


def test_mismatched_batch_size_is_an_error_on_every_rank():
    comm = _comm()
    if comm.size == 1:
        pytest.skip('needs two ranks')
    with pytest.raises(ValueError, match='same dataset length, batch_size and shuffle') as e:
        create_elastic_iterator(list(range(8)), 2 + comm.rank, comm, seed=1)
    assert 'rank 1: 8 samples, batch_size 3' in str(e.value)
    assert voice.reporter_of(e.value) == 0   # raised together: rank 0 reports it, once


def test_different_seeds_are_an_error():
    comm = _comm()
    if comm.size == 1:
        pytest.skip('needs two ranks')
    with pytest.raises(ValueError, match='same seed') as e:
        create_elastic_iterator(numpy.arange(8), 2, comm, seed=comm.rank)
    assert voice.reporter_of(e.value) == 0
