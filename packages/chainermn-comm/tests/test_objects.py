"""Objects of the ``*_obj`` calls are pickled first: what travels, and the error of one that cannot."""

import pickle

import numpy
import pytest

from chainermn_comm import CommunicationError
from chainermn_comm._objects import SMALL_BYTES, Pickled, prepickle


class _Huge:
    def __reduce__(self):
        raise MemoryError('cannot allocate 45.5 TiB')


def _roundtrip(sent):
    from mpi4py import MPI
    data, bufs = MPI.pickle.dumps_oob(sent)
    return MPI.pickle.loads_oob(data, [bytearray(memoryview(b)) for b in bufs])


def test_a_small_object_travels_as_itself():
    obj = {'a': 1, 'b': [1, 2, 3]}
    sent, error = prepickle(obj, 'bcast_obj(root=0)', 0, 'h0')
    assert error is None and sent is obj


def test_a_large_object_travels_as_its_pickle_and_comes_back_whole():
    obj = {'x': numpy.arange(SMALL_BYTES, dtype=numpy.float64), 'tag': 'big'}
    sent, error = prepickle(obj, 'gather_obj(root=0)', 1, 'h1')
    assert error is None and isinstance(sent, Pickled)
    back = _roundtrip(sent)
    assert back['tag'] == 'big' and numpy.array_equal(back['x'], obj['x'])


@pytest.mark.parametrize('obj,type_name,cause', [
    (lambda: 0, 'builtins.function', 'PicklingError'),
    (_Huge(), 'test_objects._Huge', 'MemoryError'),
])
def test_an_object_that_cannot_be_pickled_is_named(obj, type_name, cause):
    sent, error = prepickle(obj, 'allgather_obj()', 2, 'node7')
    assert sent is None and isinstance(error, CommunicationError)
    text = str(error)
    assert text.startswith("rank 2 (host node7): allgather_obj() cannot pickle its object of type "
                           "'{}' ({}: ".format(type_name, cause)), text
    assert text.endswith('Every rank of the call raises this error.')
    with pytest.raises(Exception):
        pickle.dumps(obj)
