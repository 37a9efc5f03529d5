"""Per-rank test: scatter an object dataset of about 4.6 GiB at 2 ranks (rank 1's part is > 2 GiB)."""

import numpy

import chainermn_comm
import chainermn_data
from chainermn_data import _scatter

comm = chainermn_comm.create_communicator('naive')
ITEM = 128 * 1024 * 1024
COUNT = 37


def test_object_dataset_over_2gib():
    data = [numpy.full(ITEM, i, dtype=numpy.uint8) for i in range(COUNT)] if comm.rank == 0 else None
    part = chainermn_data.scatter_dataset(data, comm)
    want = [int(p) for p in _scatter.part_positions(COUNT, comm.size, comm.rank, True)]
    assert len(part) == len(want)
    if comm.rank == 1:
        assert sum(part[i].nbytes for i in range(len(part))) > 2 ** 31
    for i, j in enumerate(want):
        a = part[i]
        assert a.dtype == numpy.uint8 and a.shape == (ITEM,)
        assert int(a[0]) == int(a[-1]) == j
        assert bool(numpy.all(a[::4099] == j))
    assert comm.allreduce_obj(len(part)) == comm.size * len(want)
