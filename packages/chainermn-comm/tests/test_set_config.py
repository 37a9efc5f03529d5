"""Chainer v7's ``set_config`` / ``get_config`` / ``config_scope`` on the communicators."""

import numpy
import pytest

import chainermn_comm


@pytest.fixture(scope='module')
def comm():
    return chainermn_comm.create_communicator('naive')


def test_set_and_get_the_wire(comm):
    try:
        comm.set_config('allreduce_grad_dtype', numpy.float16)
        assert comm.get_config('allreduce_grad_dtype') == numpy.float16
        assert comm.allreduce_grad_dtype == numpy.float16
        comm.set_config('allreduce_grad_dtype', None)
        assert comm.get_config('allreduce_grad_dtype') is None
    finally:
        comm.allreduce_grad_dtype = None


def test_a_wire_that_is_no_float_is_refused(comm):
    with pytest.raises(ValueError, match='allreduce_grad_dtype'):
        comm.set_config('allreduce_grad_dtype', numpy.int32)
    assert comm.allreduce_grad_dtype is None


def test_batched_copy_and_all_configs(comm):
    comm.set_config('batched_copy')          # value=True, as v7's signature
    assert comm.get_config('batched_copy') is True
    assert comm.get_config() == {'allreduce_grad_dtype': None, 'batched_copy': True}
    comm.set_config('batched_copy', False)
    assert comm.get_config('batched_copy') is False


def test_unknown_names_are_named(comm):
    with pytest.raises(ValueError, match="Unknown config: 'nope'.*'allreduce_grad_dtype', 'batched_copy'"):
        comm.set_config('nope', 1)
    with pytest.raises(KeyError, match="Unknown config: 'nope'"):
        comm.get_config('nope')


def test_config_scope(comm):
    assert not comm.within_config_scope
    with comm.config_scope():
        assert comm.within_config_scope
        comm.batched_copy = True
    assert not comm.within_config_scope and comm.get_config('batched_copy') is True
