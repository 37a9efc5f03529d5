"""A snapshot write that fails (a full disk) raises once and leaves no zip for the collector to close."""

import errno
import sys
import gc
import io

import numpy
import pytest

from chainermn_train.checkpoint.read import npz as _safe_npz


class _Full(io.BytesIO):
    """A file on a disk with ``room`` bytes."""

    def __init__(self, room):
        super().__init__()
        self.room = room

    def write(self, data):
        if self.tell() + len(data) > self.room:
            raise OSError(errno.ENOSPC, 'No space left on device')
        return super().write(data)


@pytest.mark.parametrize('room', [0, 100, 300, 5000])
def test_a_full_disk_raises_and_nothing_is_left_to_the_collector(room):
    f = _Full(room)
    unraisable = []
    old = sys.unraisablehook
    sys.unraisablehook = unraisable.append
    try:
        with pytest.raises(OSError) as info:
            _safe_npz.write_arrays(f, {'a': numpy.zeros(1000), 'b': numpy.ones(10)})
        kept = info.value   # the error outlives the file, as a failed background save's does
        f.close()
        gc.collect()
        del kept
        gc.collect()
    finally:
        sys.unraisablehook = old
    assert info.value.errno == errno.ENOSPC
    assert unraisable == [], [(u.exc_type, u.exc_value, u.object) for u in unraisable]
