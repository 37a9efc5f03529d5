"""Error paths of the GPU communicators under the NumPy stand-in for CuPy (run by test_gpu_emulated.py)."""

import numpy
import pytest

cupy = pytest.importorskip('cupy')

from chainermn_comm import CommunicationError, create_communicator  # NOQA: E402


def _use_device_of_rank():
    from mpi4py import MPI
    cupy.cuda.Device(MPI.COMM_WORLD.Get_rank() % cupy.cuda.runtime.getDeviceCount()).use()


def test_stand_in_is_active():
    assert getattr(cupy, 'IS_FAKE', False)


def test_single_node_refuses_ranks_on_several_nodes():
    _use_device_of_rank()
    with pytest.raises(ValueError, match="'single_node' needs every rank on one node"):
        create_communicator('single_node')


def test_nccl_refuses_two_ranks_on_one_gpu_with_advice():
    cupy.cuda.Device(0).use()
    c = create_communicator('pure_nccl')
    with pytest.raises(CommunicationError, match='one rank per GPU'):
        c.allreduce(cupy.ones(3, numpy.float32))
    # Trying again fails the same way instead of hanging in NCCL.
    with pytest.raises(CommunicationError):
        c.allreduce(cupy.ones(3, numpy.float32))
