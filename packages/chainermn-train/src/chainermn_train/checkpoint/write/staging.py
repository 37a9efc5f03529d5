"""A consistent host copy of what a snapshot holds: the whole file, laid out in one aligned buffer.

A background save must not write arrays that training goes on changing, so at the save every
array the object serializes is copied, on the calling thread, into its place in one host buffer
that holds the snapshot file as it will be on disk (``read.stored_zip``: headers, each array's
bytes at a 64-byte boundary, the directory after them).  The buffer is page-aligned and kept from
one save to the next (made again only when a snapshot outgrows it), so the writer thread only
fills in the checksums and hands the pages to the file system, which may then read them straight
from memory (``writer.write_aligned``: no copy into the page cache).  With arrays on a GPU (CuPy,
imported only when one is met) the buffer is page-locked (pinned) host memory, which the device
copies to fastest.  Everything else (Python numbers, strings, ``None``) becomes a new array, as
Chainer's serializer makes it.  The next save may reuse the buffer only once the write that reads
it has finished: the checkpointer waits for it first.
"""

import mmap

import chainer
import numpy

from chainermn_train.checkpoint.read import npz, stored_zip

__all__ = ['Staging', 'Image', 'capture', 'PAGE']

#: The alignment of the staging buffer and of each write of it (the direct I/O block).
PAGE = 4096
#: Bytes copied and summed at a time (fits a CPU's cache).
_PIECE = 1 << 20


class _Capture(chainer.serializer.Serializer):
    """Record each value a ``serialize`` method hands over, under Chainer's npz key, uncopied."""

    def __init__(self, target, path=''):
        self.target = target
        self.path = path

    def __getitem__(self, key):
        return _Capture(self.target, self.path + key.strip('/') + '/')

    def __call__(self, key, value):
        self.target[self.path + key.lstrip('/')] = value
        return value


def capture(obj):
    """Return ``{key: value}`` of what ``obj`` serializes (a dict is taken as it is), not copied."""
    if isinstance(obj, dict):
        return dict(obj)
    target = {}
    _Capture(target).save(obj)
    return target


def _on_host(value):
    """Return ``value`` as :func:`npz.to_arrays` takes it: NumPy and CuPy arrays as they are."""
    if value is None or npz.is_cupy(value) or (isinstance(value, numpy.ndarray)
                                            and not value.dtype.hasobject):
        return value
    if isinstance(value, chainer.get_array_types()):   # chainerx, another device
        return numpy.array(chainer.backend.CpuDevice().send(value), copy=True)
    return numpy.array(value)   # numbers, strings: a new array already


class Image:
    """A snapshot file laid out in a staging buffer; :meth:`write_to` writes it (once per save)."""

    def __init__(self, layout, buffer, crcs):
        self.layout = layout
        self.buffer = buffer   # a page-aligned uint8 array, at least the size rounded up to PAGE
        self.crcs = crcs       # each member's CRC-32, or None where the writer sums it
        self._sealed = False

    @property
    def size(self):
        """Return the file's size in bytes."""
        return self.layout.size

    def seal(self):
        """Fill in each member's local header with its CRC-32, and the directory; return the view."""
        layout, buf = self.layout, self.buffer
        if self._sealed:
            return memoryview(buf)
        crcs = []
        for m, crc in zip(layout.members, self.crcs):
            if crc is None:
                crc = layout.crc(m, buf[m.start:m.end])
            head = layout.local_header(m, crc)
            buf[m.offset:m.offset + m.local] = numpy.frombuffer(head, numpy.uint8)
            crcs.append(crc)
        tail = layout.directory(crcs)
        buf[layout.directory_offset:layout.size] = numpy.frombuffer(tail, numpy.uint8)
        self._sealed = True
        return memoryview(buf)

    def write_to(self, f, write_aligned):
        """Seal the file and write it to the new file ``f`` with ``write_aligned``; return its size."""
        return write_aligned(f, self.seal(), self.size)


def _copy_summed(buf, m, arr):
    """Copy NumPy ``arr`` into member ``m``'s place in ``buf``; return the member's CRC-32.

    A piece at a time, each summed right after its copy, while it is still in the CPU's cache:
    the writer thread then reads the buffer once only, to the disk.
    """
    crc = stored_zip.crc32(m.header)
    if not m.nbytes:
        return crc
    src = arr.T if m.fortran else arr
    dst = buf[m.start:m.end]
    if src.flags.c_contiguous:
        src = src.reshape(-1).view(numpy.uint8)
        for at in range(0, m.nbytes, _PIECE):
            dst[at:at + _PIECE] = src[at:at + _PIECE]
            crc = stored_zip.crc32(dst[at:at + _PIECE], crc)
        return crc
    view = numpy.ndarray(m.shape, m.dtype, buf.data, m.start, order='F' if m.fortran else 'C')
    numpy.copyto(view, arr, casting='no')
    return stored_zip.crc32(dst, crc)


class Staging:
    """One reused, page-aligned host buffer that :meth:`stage` fills with a snapshot file."""

    def __init__(self):
        self._buffer = None   # uint8 array, page-aligned
        self._keep = None     # what owns its memory (an mmap, or CuPy's pinned block)
        self._pinned = False

    @property
    def nbytes(self):
        """Return the bytes the staging buffer holds."""
        return 0 if self._buffer is None else self._buffer.nbytes

    def _room(self, size, pinned):
        want = -(-max(size, 1) // PAGE) * PAGE
        if self._buffer is not None and self._buffer.nbytes >= want and self._pinned == pinned:
            return self._buffer
        self._buffer = self._keep = None   # the old buffer goes before the new one is made
        if pinned:
            import cupy   # only a GPU array leads here
            mem = cupy.cuda.alloc_pinned_memory(want + PAGE)
            raw = numpy.frombuffer(mem, numpy.uint8, want + PAGE)
            skip = -raw.ctypes.data % PAGE
            self._buffer, self._keep = raw[skip:skip + want], mem
        else:
            mem = mmap.mmap(-1, want)
            if hasattr(mmap, 'MADV_HUGEPAGE'):   # fewer pages to fault in and to pin
                mem.madvise(mmap.MADV_HUGEPAGE)
            self._buffer, self._keep = numpy.frombuffer(mem, numpy.uint8), mem
        self._pinned = pinned
        return self._buffer

    def stage(self, values, meta=None):
        """Return an :class:`Image` of the snapshot of ``values`` (:func:`capture`'s) and ``meta``.

        Every array is copied into the staging buffer before this returns.
        """
        arrays = npz.to_arrays({key: _on_host(value) for key, value in values.items()}, meta)
        layout = stored_zip.Layout(arrays)
        buf = self._room(layout.size, any(npz.is_cupy(a) for a in arrays.values()))
        crcs = []
        for m, arr in zip(layout.members, arrays.values()):
            buf[m.start - len(m.header):m.start] = numpy.frombuffer(m.header, numpy.uint8)
            if npz.is_cupy(arr):
                if m.nbytes:
                    arr.get(out=numpy.ndarray(m.shape, m.dtype, buf.data, m.start))   # synchronous
                crcs.append(None)   # summed by the writer thread
            else:
                crcs.append(_copy_summed(buf, m, arr))
        image = Image(layout, buf, crcs)
        if None not in crcs:   # sealed here: the writer thread then runs almost no Python (the GIL)
            image.seal()
        return image
