"""Snapshot files that load without pickle: npz of plain arrays, ``None`` values listed by name.

Chainer's serializers turn a ``None`` value into a 0-d object array, which ``numpy.savez`` pickles
and which only loads with ``allow_pickle=True`` -- and unpickling runs whatever code the file names.
:func:`write` stores no object array: the keys whose value is ``None`` are listed in the string
array ``__chainermn_none__`` instead, and :func:`read` rebuilds them in memory.  :func:`read` looks
at every member's ``.npy`` header before reading it and never unpickles unless told to: a member of
object dtype (a file written by chainermn before this format, or tampered with) raises
:class:`PickleRequired`, which names the file and the keys.
"""

import zipfile

import chainer
import numpy
from numpy.lib import format as npy_format

__all__ = ['FORMAT_KEY', 'NONE_KEY', 'META_PREFIX', 'FORMAT_VERSION', 'PickleRequired', 'to_arrays',
           'write', 'read', 'read_meta', 'split_meta']

#: Reserved key holding the format version (int64 0-d array).
FORMAT_KEY = '__chainermn_format__'
#: Reserved key holding the names of the keys whose value is ``None`` (1-d unicode array).
NONE_KEY = '__chainermn_none__'
#: Prefix of the reserved keys holding the generation's metadata (plain numeric arrays).
META_PREFIX = '__chainermn_meta__/'
FORMAT_VERSION = 1
_RESERVED = (FORMAT_KEY, NONE_KEY)
_MAX_KEYS_SHOWN = 8


class PickleRequired(ValueError):
    """Raised by :func:`read` when a file holds pickled object arrays and pickle is not allowed."""

    def __init__(self, path, keys):
        self.path = path
        self.keys = list(keys)
        shown = ', '.join(repr(k) for k in self.keys[:_MAX_KEYS_SHOWN])
        if len(self.keys) > _MAX_KEYS_SHOWN:
            shown += ' and {} more'.format(len(self.keys) - _MAX_KEYS_SHOWN)
        super().__init__('{} needs pickle to load key(s) {} (written by chainermn before pickle-free '
                         'snapshots, or tampered with); unpickling can run any code'.format(path, shown))


def _is_none(arr):
    return arr.dtype.hasobject and arr.shape == () and arr[()] is None


def to_arrays(obj, meta=None):
    """Serialize ``obj`` (or take a ready dict of values) into a dict of arrays with no object array.

    ``meta`` (a dict of numbers) is stored under :data:`META_PREFIX`.
    """
    if isinstance(obj, dict):
        target = obj
    else:
        serializer = chainer.serializers.DictionarySerializer()
        serializer.save(obj)
        target = serializer.target
    out = {}
    nones = []
    for key, value in target.items():
        if key in _RESERVED or key.startswith(META_PREFIX):
            raise ValueError('cannot save a snapshot with the reserved key {!r}; rename that '
                             'attribute'.format(key))
        arr = numpy.asanyarray(value)
        if _is_none(arr):
            nones.append(key)
            continue
        if arr.dtype.hasobject:
            raise TypeError('cannot save key {!r} of the snapshot without pickle: its value is an '
                            'object array ({} of shape {}, first element a {}); make its serialize() '
                            'store arrays, numbers, strings or None'.format(
                                key, type(value).__name__, arr.shape,
                                type(arr.flat[0]).__name__ if arr.size else 'nothing'))
        out[key] = arr
    for key, value in (meta or {}).items():
        arr = numpy.asarray(value)
        if arr.dtype.hasobject:
            raise TypeError('metadata {!r} must be numeric; got {!r}'.format(key, value))
        out[META_PREFIX + key] = arr
    out[FORMAT_KEY] = numpy.asarray(FORMAT_VERSION, dtype=numpy.int64)
    out[NONE_KEY] = numpy.asarray(sorted(nones), dtype=str) if nones else numpy.zeros(0, dtype='<U1')
    return out


def write(f, obj, meta=None):
    """Write the snapshot of ``obj`` (and ``meta``) to the binary file object ``f`` (uncompressed npz)."""
    numpy.savez(f, **to_arrays(obj, meta))


def split_meta(values):
    """Remove the metadata keys from ``values`` (in place) and return them as a dict of numbers."""
    meta = {}
    for key in [k for k in values if k.startswith(META_PREFIX)]:
        arr = values.pop(key)
        meta[key[len(META_PREFIX):]] = arr.item() if arr.shape == () else arr
    return meta


def read_meta(path):
    """Return the metadata dict of the snapshot at ``path`` ({} for a file written without it).

    Reads only the metadata members; a metadata member that needs pickle raises
    :class:`PickleRequired`.  Corrupt files raise what ``zipfile``/NumPy raise.
    """
    values = {}
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            if not info.filename.startswith(META_PREFIX) or not info.filename.endswith('.npy'):
                continue
            with zf.open(info) as fp:
                if _header_dtype(fp).hasobject:
                    raise PickleRequired(path, [info.filename[:-4]])
            values[info.filename[:-4]] = _read_member(zf, info, False)
    return split_meta(values)


def _header_dtype(fp):
    version = npy_format.read_magic(fp)
    if version == (1, 0):
        return npy_format.read_array_header_1_0(fp)[2]
    if version == (2, 0):
        return npy_format.read_array_header_2_0(fp)[2]
    return npy_format._read_array_header(fp, version)[2]  # 3.0: no public reader


def _read_member(zf, info, allow_pickle):
    with zf.open(info) as fp:
        arr = npy_format.read_array(fp, allow_pickle=allow_pickle)
        fp.read()  # reach the end of the member so that zipfile checks its CRC
    return arr


def read(path, allow_pickle=False):
    """Return ``(values, pickled_keys)`` of the snapshot at ``path``; raise if it cannot be used.

    ``path`` may also be a binary file object.  Metadata keys stay in ``values`` (see
    :func:`split_meta`).
    ``values`` maps every key to its array (``None`` values as 0-d object arrays, as Chainer's
    deserializer expects).  Object-dtype members raise :class:`PickleRequired` unless
    ``allow_pickle`` (then they are unpickled and listed in ``pickled_keys``).  Truncated or corrupt
    files raise what ``zipfile``/NumPy raise.
    """
    values = {}
    pickled = []
    with zipfile.ZipFile(path) as zf:
        infos = zf.infolist()
        for info in infos:
            if not info.filename.endswith('.npy'):
                raise ValueError('{}: member {!r} is not a .npy array; not a snapshot'.format(
                    path, info.filename))
            with zf.open(info) as fp:
                if _header_dtype(fp).hasobject:
                    pickled.append(info.filename[:-4])
        if pickled and not allow_pickle:
            raise PickleRequired(path, pickled)
        for info in infos:
            values[info.filename[:-4]] = _read_member(zf, info, allow_pickle)
    version = values.pop(FORMAT_KEY, None)
    if version is not None and (version.shape != () or version.dtype.kind not in 'iu'
                                or int(version) > FORMAT_VERSION):
        raise ValueError('{}: snapshot format {} is newer than this chainermn reads ({}); '
                         'upgrade chainermn'.format(path, version, FORMAT_VERSION))
    nones = values.pop(NONE_KEY, numpy.zeros(0, dtype='<U1'))
    if nones.dtype.kind != 'U' or nones.ndim != 1:
        raise ValueError('{}: {} must be a 1-d string array; got {} of shape {}'.format(
            path, NONE_KEY, nones.dtype, nones.shape))
    for key in nones.tolist():
        values[key] = numpy.asarray(None)
    return values, pickled
