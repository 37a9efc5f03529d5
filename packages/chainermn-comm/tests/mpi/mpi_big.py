"""Messages over 2 GiB (arrays through send/bcast, pickles through send_obj/bcast_obj); 2 ranks.

Rank 0 builds one deterministic blob of 2 GiB + 4099 bytes; later tests send on what arrived,
so each test touches as little fresh memory as possible (first touches dominate the run time).
The sender also sends a small checksum, which the receiver compares.  Peak memory is about
12 GB for both ranks together (during the in-band pickle of ``bytes``).
"""

import hashlib

import numpy
import pytest

import chainermn_comm

NBYTES = (1 << 31) + 4099  # just over 2 GiB, not a multiple of the 1 GiB piece size
_ROW = 1 << 20
_held = {}


@pytest.fixture(scope='module')
def comm():
    c = chainermn_comm.create_communicator('naive')
    assert c.size == 2, 'run this file on exactly 2 ranks'
    return c


def make_blob():
    """Return deterministic bytes in which every 1 MiB row differs (misplaced pieces are detected)."""
    a = numpy.empty(NBYTES, dtype=numpy.uint8)
    pattern = (numpy.arange(_ROW, dtype=numpy.uint64) * 2654435761 >> 7).astype(numpy.uint8)
    for i, start in enumerate(range(0, NBYTES, _ROW)):
        chunk = a[start:start + _ROW]
        numpy.add(pattern[:chunk.size], numpy.uint8(i % 251), out=chunk)
    return a


def checksum(buf):
    """Return a cheap position-sensitive checksum (word sum + hash of a strided sample and the tail)."""
    a = numpy.frombuffer(buf, dtype=numpy.uint8)
    n8 = a.size // 8 * 8
    total = int(a[:n8].view(numpy.uint64).sum(dtype=numpy.uint64))
    sample = hashlib.sha256(a[::4093].tobytes() + a[n8:].tobytes()).hexdigest()
    return a.size, total, sample


def test_send_recv_array(comm):
    if comm.rank == 0:
        blob = _held['blob'] = make_blob()
        _held['sum'] = checksum(blob)
        comm.send(blob, 1, 5)
        comm.send_obj(_held['sum'], 1, 6)
    else:
        got = comm.recv(0, 5)
        _held['sum'] = comm.recv_obj(0, 6)
        assert got.dtype == numpy.uint8 and got.shape == (NBYTES,)
        assert checksum(got) == _held['sum']
        _held['blob'] = got


def test_bcast_array_from_rank_1(comm):
    got = comm.bcast(_held['blob'] if comm.rank == 1 else None, root=1)
    assert got.shape == (NBYTES,) and got.dtype == numpy.uint8
    if comm.rank == 0:
        assert checksum(got) == _held['sum']


def test_send_obj_pickle_over_2gib(comm):
    # bytes pickle in-band: the pickle stream itself is larger than 2 GiB.
    if comm.rank == 1:
        comm.send_obj({'name': 'big', 'data': _held['blob'].tobytes()}, 0, 7)
    else:
        obj = comm.recv_obj(1, 7)
        assert obj['name'] == 'big' and isinstance(obj['data'], bytes)
        assert checksum(obj['data']) == _held['sum']


def test_bcast_obj_over_2gib(comm):
    got = comm.bcast_obj(('tuple', _held['blob']) if comm.rank == 0 else None, root=0)
    assert got[0] == 'tuple' and got[1].shape == (NBYTES,)
    if comm.rank == 1:
        assert checksum(got[1]) == _held['sum']
    assert comm.allreduce_obj(1) == 2
