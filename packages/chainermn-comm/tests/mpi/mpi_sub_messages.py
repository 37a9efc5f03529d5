"""Per-rank checks (run by test_sub_messages_mpi.py): a communicator's own errors name ranks as the job does."""

import pytest

import chainermn_comm


def test_errors_on_a_split_communicator_name_the_world_rank_and_the_own_rank_beside_it():
    comm = chainermn_comm.create_communicator('naive')
    sub = comm.split(comm.rank % 2, comm.rank)
    with pytest.raises(ValueError) as e:
        sub.send_obj(1, dest=0, tag=-1)
    text = str(e.value)
    if sub.size == comm.size:   # one rank, or a split that keeps the job's numbering
        assert text.startswith('rank {}: tag must be'.format(comm.rank)), text
    else:
        assert text.startswith('rank {} (rank {} of the split communicator): tag must be'.format(
            comm.rank, sub.rank)), text
    with pytest.raises(ValueError) as e:
        comm.send_obj(1, dest=0, tag=-1)
    assert str(e.value).startswith('rank {}: tag must be'.format(comm.rank)), str(e.value)
    sub.finalize()
