"""Record what an object writes to a Chainer serializer, and replay it into another serializer."""

import numpy
from chainer.serializer import Serializer

__all__ = ['record', 'replay']


class _Recorder(Serializer):
    """Serializer that keeps ``(path, value)`` pairs in a list instead of writing them anywhere."""

    def __init__(self, records, path=''):
        self.records = records
        self.path = path

    def __getitem__(self, key):
        return _Recorder(self.records, self.path + key + '/')

    def __call__(self, key, value):
        if isinstance(value, numpy.ndarray):
            saved = value.copy()
        elif hasattr(value, 'get') and hasattr(value, 'device'):  # a CuPy array
            saved = value.get()
        else:
            saved = value
        self.records.append((self.path + key, saved))
        return value


def record(obj):
    """Return the list of ``(path, value)`` pairs that ``obj.serialize`` writes."""
    records = []
    obj.serialize(_Recorder(records))
    return records


def replay(records, serializer):
    """Write recorded ``(path, value)`` pairs into ``serializer``."""
    for path, value in records:
        parts = path.split('/')
        target = serializer
        for part in parts[:-1]:
            target = target[part]
        target(parts[-1], value)
