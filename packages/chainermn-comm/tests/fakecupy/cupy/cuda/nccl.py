"""``cupy.cuda.nccl`` stand-in: an NCCL communicator carried out with MPI on host memory.

A communicator's members find each other through ``MPI.COMM_WORLD`` (the unique id names the
world rank of NCCL rank 0 and a serial number), then build an MPI communicator of just those
processes with ``Create_group``, so only the members take part, as with NCCL.
"""

import numpy

from cupy._kernels import from_bf16, to_bf16
from cupy._ndarray import host_view

__all__ = ['NcclError', 'NcclCommunicator', 'get_unique_id', 'get_version', 'get_build_version',
           'groupStart', 'groupEnd']

(NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_UINT32, NCCL_INT64, NCCL_UINT64, NCCL_FLOAT16,
 NCCL_FLOAT32, NCCL_FLOAT64, NCCL_BFLOAT16) = range(10)
NCCL_CHAR, NCCL_INT, NCCL_HALF, NCCL_FLOAT, NCCL_DOUBLE = (NCCL_INT8, NCCL_INT32, NCCL_FLOAT16,
                                                            NCCL_FLOAT32, NCCL_FLOAT64)
NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN, NCCL_AVG = range(5)

_DTYPES = {NCCL_INT8: numpy.int8, NCCL_UINT8: numpy.uint8, NCCL_INT32: numpy.int32,
           NCCL_UINT32: numpy.uint32, NCCL_INT64: numpy.int64, NCCL_UINT64: numpy.uint64,
           NCCL_FLOAT16: numpy.float16, NCCL_FLOAT32: numpy.float32, NCCL_FLOAT64: numpy.float64,
           NCCL_BFLOAT16: numpy.uint16}  # bfloat16 words; reductions add them widened to float32
_TAG = 31000
_serial = [0]


class NcclError(RuntimeError):
    """What CuPy raises for a failing NCCL call."""

    def __init__(self, status, msg=''):
        self.status = status
        super().__init__('NCCL_ERROR ({}){}'.format(status, ': ' + msg if msg else ''))


def get_version():
    return 22000


def get_build_version():
    return 22000


def groupStart():
    pass


def groupEnd():
    pass


def get_unique_id():
    """Return an id naming this process (NCCL rank 0) and a fresh serial number."""
    from mpi4py import MPI
    _serial[0] += 1
    return (MPI.COMM_WORLD.Get_rank(), _serial[0]) + (0,) * 126


def _mpi_op(op):
    from mpi4py import MPI
    try:
        return {NCCL_SUM: MPI.SUM, NCCL_PROD: MPI.PROD, NCCL_MAX: MPI.MAX, NCCL_MIN: MPI.MIN}[op]
    except KeyError:
        raise NcclError(4, 'invalid reduction op {}'.format(op))


def _dtype(datatype):
    try:
        return numpy.dtype(_DTYPES[datatype])
    except KeyError:
        raise NcclError(4, 'invalid data type {}'.format(datatype))


class NcclCommunicator:
    """NCCL communicator of ``ndev`` ranks; this process is ``rank``."""

    def __init__(self, ndev, commId, rank):
        from mpi4py import MPI
        from cupy.cuda import runtime
        if not 0 <= rank < ndev:
            raise NcclError(4, 'rank {} out of range for {} ranks'.format(rank, ndev))
        world = MPI.COMM_WORLD
        root, serial = int(commId[0]), int(commId[1])
        tag = _TAG + serial % 1000
        me = world.Get_rank()
        if rank == 0:
            members = {0: me}
            for _ in range(ndev - 1):
                r, w = world.recv(source=MPI.ANY_SOURCE, tag=tag)
                members[r] = w
            order = [members[r] for r in range(ndev)]
            for r in range(1, ndev):
                world.send(order, dest=members[r], tag=tag)
        else:
            world.send((rank, me), dest=root, tag=tag)
            order = world.recv(source=root, tag=tag)
        group = world.Get_group().Incl(order)
        self._comm = world.Create_group(group, tag=tag)
        group.Free()
        self._device = runtime.getDevice()
        devices = self._comm.allgather(self._device)
        if len(set(devices)) != len(devices):
            self._comm.Free()
            self._comm = None
            raise NcclError(5, 'Duplicate GPU detected: ranks share devices {}'.format(devices))
        self._rank, self._size = rank, ndev
        self.aborted = False

    # -- bookkeeping -------------------------------------------------------
    def _live(self):
        if self._comm is None:
            raise NcclError(5, 'communicator was destroyed or aborted')
        from cupy.cuda import runtime
        if runtime.getDevice() != self._device:
            raise NcclError(5, 'called on device {} but created on device {}'.format(
                runtime.getDevice(), self._device))
        return self._comm

    def device_id(self):
        return self._device

    def rank_id(self):
        return self._rank

    def size(self):
        return self._size

    def check_async_error(self):
        pass

    def abort(self):
        self.aborted = True
        self.destroy()

    def destroy(self):
        if self._comm is not None:
            self._comm.Free()
            self._comm = None

    # -- collectives -------------------------------------------------------
    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):
        from mpi4py import MPI
        comm, dt = self._live(), _dtype(datatype)
        recv = host_view(recvbuf, count * dt.itemsize, dt)
        if datatype == NCCL_BFLOAT16:
            wide = from_bf16(host_view(sendbuf, count * 2, dt))
            comm.Allreduce(MPI.IN_PLACE, wide, _mpi_op(op))
            recv[...] = to_bf16(wide)
            return
        if sendbuf == recvbuf:
            comm.Allreduce(MPI.IN_PLACE, recv, _mpi_op(op))
        else:
            comm.Allreduce(host_view(sendbuf, count * dt.itemsize, dt).copy(), recv, _mpi_op(op))

    def reduce(self, sendbuf, recvbuf, count, datatype, op, root, stream):
        from mpi4py import MPI
        comm, dt = self._live(), _dtype(datatype)
        send = host_view(sendbuf, count * dt.itemsize, dt)
        if datatype == NCCL_BFLOAT16:
            wide = from_bf16(send)
            comm.Reduce(MPI.IN_PLACE if comm.Get_rank() == root else wide, wide if comm.Get_rank() == root
                        else None, _mpi_op(op), root=root)
            if comm.Get_rank() == root:
                host_view(recvbuf, count * 2, dt)[...] = to_bf16(wide)
            return
        if comm.Get_rank() == root:
            recv = host_view(recvbuf, count * dt.itemsize, dt)
            comm.Reduce(MPI.IN_PLACE if sendbuf == recvbuf else send.copy(), recv, _mpi_op(op), root=root)
        else:
            comm.Reduce(send, None, _mpi_op(op), root=root)

    def bcast(self, buff, count, datatype, root, stream):
        comm, dt = self._live(), _dtype(datatype)
        comm.Bcast(host_view(buff, count * dt.itemsize, dt), root=root)

    def broadcast(self, sendbuff, recvbuff, count, datatype, root, stream):
        comm, dt = self._live(), _dtype(datatype)
        recv = host_view(recvbuff, count * dt.itemsize, dt)
        if comm.Get_rank() == root and sendbuff != recvbuff:
            recv[...] = host_view(sendbuff, count * dt.itemsize, dt)
        comm.Bcast(recv, root=root)

    def reduceScatter(self, sendbuf, recvbuf, recvcount, datatype, op, stream):
        comm, dt = self._live(), _dtype(datatype)
        send = host_view(sendbuf, recvcount * self._size * dt.itemsize, dt).copy()
        if datatype == NCCL_BFLOAT16:
            part = numpy.empty(recvcount, numpy.float32)
            comm.Reduce_scatter_block(from_bf16(send), part, _mpi_op(op))
            host_view(recvbuf, recvcount * 2, dt)[...] = to_bf16(part)
            return
        comm.Reduce_scatter_block(send, host_view(recvbuf, recvcount * dt.itemsize, dt), _mpi_op(op))

    def allGather(self, sendbuf, recvbuf, count, datatype, stream):
        comm, dt = self._live(), _dtype(datatype)
        send = host_view(sendbuf, count * dt.itemsize, dt).copy()
        comm.Allgather(send, host_view(recvbuf, count * self._size * dt.itemsize, dt))

    def send(self, sendbuf, count, datatype, peer, stream):
        comm, dt = self._live(), _dtype(datatype)
        comm.Send(host_view(sendbuf, count * dt.itemsize, dt), dest=peer, tag=_TAG - 1)

    def recv(self, recvbuf, count, datatype, peer, stream):
        comm, dt = self._live(), _dtype(datatype)
        comm.Recv(host_view(recvbuf, count * dt.itemsize, dt), source=peer, tag=_TAG - 1)
