"""recv_obj with Chainer v7's signature ``(source, status=None, tag=ANY_TAG)`` (per rank, 1-3 ranks).

$CHAINERMN_TEST_RECV_OBJ_COMMS lists the communicators (default ``naive``); with the NumPy
stand-in for CuPy first on PYTHONPATH the GPU communicators run too (they share the MPI base).
"""

import inspect
import os
import pickle

import numpy
import pytest
from mpi4py import MPI

import chainermn_comm

NAMES = [n for n in os.environ.get('CHAINERMN_TEST_RECV_OBJ_COMMS', 'naive').split(',') if n]
_comms = {}


def get(name):
    if name not in _comms:
        if name != 'naive':
            import cupy
            cupy.cuda.Device(MPI.COMM_WORLD.Get_rank()).use()
        _comms[name] = chainermn_comm.create_communicator(name)
    return _comms[name]


def ring(comm, send, recv):
    """Send to the next rank and receive from the previous one without deadlock."""
    nxt, prev = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    if comm.rank % 2 == 0:
        send(nxt)
        return recv(prev)
    got = recv(prev)
    send(nxt)
    return got


def need_peers(comm):
    if comm.size < 2:
        pytest.skip('point-to-point needs 2 ranks')


def payload(rank, k):
    return {'rank': rank, 'k': k, 'text': 'r{}-{}'.format(rank, k) * (k + 1)}


@pytest.mark.parametrize('name', NAMES)
def test_signature_is_v7s(name):
    params = inspect.signature(get(name).recv_obj).parameters
    assert list(params) == ['source', 'status', 'tag']
    assert params['status'].default is None and params['tag'].default is None


@pytest.mark.parametrize('name', NAMES)
def test_status_is_filled_and_tag_defaults_to_any(name):
    comm = get(name)
    need_peers(comm)
    prev = (comm.rank - 1) % comm.size
    big = 'x' * 300000   # past MPICH's eager limit

    def send(dest):
        comm.send_obj(payload(comm.rank, 0), dest, 7)
        comm.send_obj(big, dest, 9)
        comm.send_obj(payload(comm.rank, 2), dest, 0)
        comm.send_obj(payload(comm.rank, 3), dest, 5)
        comm.send_obj(payload(comm.rank, 4), dest, 11)

    def recv(src):
        got = []
        st = MPI.Status()
        got.append((comm.recv_obj(src, st), st.Get_source(), st.Get_tag(),
                    st.Get_count(MPI.BYTE)))                      # v7: status in second place
        st = MPI.Status()
        got.append((comm.recv_obj(src, status=st), st.Get_source(), st.Get_tag()))
        got.append(comm.recv_obj(src, tag=0))                    # keyword tag, no status
        got.append(comm.recv_obj(src, None, MPI.ANY_TAG))        # v7 order, explicit ANY_TAG
        got.append(comm.recv_obj(src))                           # default: any tag
        return got

    one, two, three, four, five = ring(comm, send, recv)
    assert one[:3] == (payload(prev, 0), prev, 7)
    assert one[3] == len(pickle.dumps(payload(prev, 0), pickle.HIGHEST_PROTOCOL))
    assert two == (big, prev, 9)
    assert three == payload(prev, 2)
    assert four == payload(prev, 3)
    assert five == payload(prev, 4)


@pytest.mark.parametrize('name', NAMES)
def test_reference_positional_tag_still_works(name):
    # recv_obj(source, tag) of the reference (ChainerMN 1.3): an int in the status place is the tag.
    comm = get(name)
    need_peers(comm)

    def send(dest):
        comm.send_obj('late', dest, 4)
        comm.send_obj('early', dest, 3)

    # Tag 3 is asked for first although tag 4 was sent first: the tag really selects.
    got = ring(comm, send, lambda s: (comm.recv_obj(s, 3), comm.recv_obj(s, numpy.int64(4))))
    assert got == ('early', 'late')


@pytest.mark.parametrize('name', NAMES)
def test_any_tag_drains_an_array_message_and_stays_in_step(name):
    comm = get(name)
    need_peers(comm)

    def send(dest):
        comm.send(numpy.arange(300000, dtype=numpy.float64) + comm.rank, dest, 6)
        comm.send_obj('after', dest, 8)

    def recv(src):
        st = MPI.Status()
        with pytest.raises(chainermn_comm.CommunicationError, match=r'tag=6\) got an array message'):
            comm.recv_obj(src, st)
        assert st.Get_tag() == 6 and st.Get_source() == src
        st = MPI.Status()
        return comm.recv_obj(src, st), st.Get_tag()

    assert ring(comm, send, recv) == ('after', 8)


@pytest.mark.parametrize('name', NAMES)
def test_argument_errors(name):
    comm = get(name)
    with pytest.raises(TypeError, match='status must be None or an mpi4py.MPI.Status; got str'):
        comm.recv_obj(0, 'status')
    with pytest.raises(TypeError, match=r'got the tag twice \(3 in the place of status, and tag=4\)'):
        comm.recv_obj(0, 3, tag=4)
    with pytest.raises(ValueError, match='tag must be a non-negative int'):
        comm.recv_obj(0, tag=-7)
    with pytest.raises(ValueError, match='source'):
        comm.recv_obj(comm.size, MPI.Status())
