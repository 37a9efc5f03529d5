"""The bytes of an npz (a zip of uncompressed ``.npy`` members), laid out here and read by ``zipfile``.

:class:`Layout` places each member (its local header, its ``.npy`` header, the array's bytes) and
the central directory.  Each array's bytes start at a 64-byte boundary of the file (a padding field
in the member's local header, as ``zipalign`` pads), so that one host buffer can hold the whole
file with every array in place and aligned (``write.staging``).  Sizes and offsets are written in
zip64 form, as ``numpy.savez`` writes its members, so that no array or file is too large.
:func:`write` writes arrays from their own memory.

The CRC-32 of each member is zlib-ng's: the same number as zlib's, about 8x faster on the machine
measured (10 ms against 82 ms for 292 MB).
"""

import io
import struct
import time

import numpy
from numpy.lib import format as npy_format

from zlib_ng.zlib_ng import crc32

__all__ = ['Layout', 'write', 'crc32', 'ALIGN', 'bytes_of']

#: The boundary each array's bytes start at, counted from the start of the file.
ALIGN = 64

_LOCAL = struct.Struct('<4s5H3L2H')
_CENTRAL = struct.Struct('<4s4B4HL2L5H2L')
_ZIP64_LOCAL = struct.Struct('<2H2Q')     # id 1: uncompressed and compressed size
_ZIP64_CENTRAL = struct.Struct('<2H3Q')   # id 1: both sizes and the local header's offset
_ZIP64_END = struct.Struct('<4sQ2H2L4Q')
_ZIP64_LOCATOR = struct.Struct('<4sLQL')
_END = struct.Struct('<4s4H2LH')
_PAD = struct.Struct('<2H')               # a padding field: its id and length
_PAD_ID = 0xD935                          # the id zipalign pads with
_VERSION = 45                             # zip64
_UTF8 = 0x800
_UNIX = 3
_MODE = 0o600 << 16
_FULL32 = 0xFFFFFFFF
_FULL16 = 0xFFFF
#: Largest piece handed to one ``write`` call.
_PIECE = 16 << 20


def _npy_header(shape, dtype, fortran):
    fields = {'descr': npy_format.dtype_to_descr(dtype), 'fortran_order': fortran,
              'shape': tuple(int(n) for n in shape)}
    out = io.BytesIO()
    try:
        npy_format.write_array_header_1_0(out, fields)
    except ValueError:   # a header over 64 KiB: version 2.0 holds it
        out = io.BytesIO()
        npy_format.write_array_header_2_0(out, fields)
    return out.getvalue()


def _dos_time(now):
    t = time.localtime(now)
    return ((t.tm_hour << 11) | (t.tm_min << 5) | (t.tm_sec // 2),
            ((max(t.tm_year, 1980) - 1980) << 9) | (t.tm_mon << 5) | t.tm_mday)


class _Member:
    __slots__ = ('name', 'flags', 'header', 'shape', 'dtype', 'fortran', 'nbytes', 'offset',
                 'local', 'start', 'end')


class Layout:
    """Where each member of an npz of ``arrays`` lies; ``arrays``: ``{key: array}`` (NumPy or CuPy).

    For a member ``m`` of :attr:`members`: its local header is ``[m.offset, m.offset + m.local)``,
    its stored bytes (``.npy`` header and array) ``[m.offset + m.local, m.end)``, the array's bytes
    ``[m.start, m.end)`` in C order (Fortran order when ``m.fortran``).  The central directory and
    the end records fill ``[directory_offset, size)``.
    """

    def __init__(self, arrays, now=None):
        self.time, self.date = _dos_time(time.time() if now is None else now)
        self.members = []
        pos = 0
        for key, arr in arrays.items():
            m = _Member()
            m.name = (key + '.npy').encode('utf-8')
            m.flags = 0 if m.name.isascii() else _UTF8
            m.shape = tuple(arr.shape)
            m.dtype = numpy.dtype(arr.dtype)
            m.fortran = bool(isinstance(arr, numpy.ndarray) and arr.flags.f_contiguous
                             and not arr.flags.c_contiguous)
            m.header = _npy_header(m.shape, m.dtype, m.fortran)
            m.nbytes = int(numpy.prod(m.shape, dtype=numpy.int64)) * m.dtype.itemsize
            base = pos + _LOCAL.size + len(m.name) + _ZIP64_LOCAL.size
            pad = -(base + len(m.header)) % ALIGN
            if 0 < pad < _PAD.size:
                pad += ALIGN
            m.offset = pos
            m.local = base + pad - pos
            m.start = base + pad + len(m.header)
            m.end = m.start + m.nbytes
            pos = m.end
            self.members.append(m)
        self.directory_offset = pos
        self.size = pos + sum(_CENTRAL.size + len(m.name) + _ZIP64_CENTRAL.size for m in self.members) \
            + _ZIP64_END.size + _ZIP64_LOCATOR.size + _END.size

    def local_header(self, m, crc):
        """Return the local header of member ``m`` whose CRC-32 is ``crc``."""
        size = len(m.header) + m.nbytes
        pad = m.local - _LOCAL.size - len(m.name) - _ZIP64_LOCAL.size
        out = [_LOCAL.pack(b'PK\x03\x04', _VERSION, m.flags, 0, self.time, self.date, crc, _FULL32,
                           _FULL32, len(m.name), m.local - _LOCAL.size - len(m.name)),
               m.name, _ZIP64_LOCAL.pack(1, 16, size, size)]
        if pad:
            out += [_PAD.pack(_PAD_ID, pad - _PAD.size), bytes(pad - _PAD.size)]
        return b''.join(out)

    def crc(self, m, data):
        """Return the CRC-32 of member ``m`` whose array bytes are ``data``."""
        return crc32(data, crc32(m.header))

    def directory(self, crcs):
        """Return the central directory and end records, given each member's CRC-32."""
        out = []
        for m, crc in zip(self.members, crcs):
            size = len(m.header) + m.nbytes
            out += [_CENTRAL.pack(b'PK\x01\x02', _VERSION, _UNIX, _VERSION, 0, m.flags, 0, self.time,
                                  self.date, crc, _FULL32, _FULL32, len(m.name), _ZIP64_CENTRAL.size,
                                  0, 0, 0, _MODE, _FULL32),
                    m.name, _ZIP64_CENTRAL.pack(1, 24, size, size, m.offset)]
        count = len(self.members)
        length = sum(len(b) for b in out)
        end64 = self.directory_offset + length
        out += [_ZIP64_END.pack(b'PK\x06\x06', _ZIP64_END.size - 12, _VERSION, _VERSION, 0, 0,
                                count, count, length, self.directory_offset),
                _ZIP64_LOCATOR.pack(b'PK\x06\x07', 0, end64, 1),
                _END.pack(b'PK\x05\x06', 0, 0, min(count, _FULL16), min(count, _FULL16),
                          min(length, _FULL32), min(self.directory_offset, _FULL32), 0)]
        return b''.join(out)


def bytes_of(arr, fortran):
    """Return the bytes of NumPy ``arr`` as a member stores them (a view where it can be one)."""
    if fortran:
        arr = arr.T
    if not arr.flags.c_contiguous:
        arr = numpy.ascontiguousarray(arr)
    if arr.dtype.itemsize == 0 or arr.size == 0:
        return b''
    return memoryview(arr.reshape(-1).view(numpy.uint8))


def write(f, arrays):
    """Write ``arrays`` (``{key: NumPy array}``) to the binary file ``f`` as an npz; return its size.

    Each array is read twice (its CRC, then its bytes) and never copied whole.
    """
    layout = Layout(arrays)
    datas = [bytes_of(numpy.asanyarray(a), m.fortran) for a, m in zip(arrays.values(), layout.members)]
    crcs = [layout.crc(m, d) for m, d in zip(layout.members, datas)]
    for m, data, crc in zip(layout.members, datas, crcs):
        f.write(layout.local_header(m, crc) + m.header)
        for at in range(0, len(data), _PIECE):
            f.write(data[at:at + _PIECE])
    f.write(layout.directory(crcs))
    return layout.size
