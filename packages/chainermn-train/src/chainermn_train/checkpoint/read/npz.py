"""Snapshot files that load without pickle: npz of plain arrays, ``None`` values listed by name.

Chainer's serializers turn a ``None`` value into a 0-d object array, which ``numpy.savez`` pickles
and which only loads with ``allow_pickle=True`` -- and unpickling runs whatever code the file names.
:func:`write` stores no object array: the keys whose value is ``None`` are listed in the string
array ``__chainermn_none__`` instead, and :func:`read` rebuilds them in memory.  :func:`read` looks
at every member's ``.npy`` header before reading it and never unpickles unless told to: a member of
object dtype (a file written by chainermn before this format, or tampered with) raises
:class:`PickleRequired`, which names the file and the keys.

Reads are bounded before anything is decompressed (:class:`MemberTooLarge`): given the byte limit
of each key the target needs (its shape is known from the model and optimizer), a member whose
zip entry declares more is refused, a member whose ``.npy`` header disagrees with its entry's
size is refused, a stored member must declare what it stores, and the compressed members whose
size the target cannot tell are bounded together; ``zipfile`` never
inflates more than an entry declares, so a lying header ends in a short read and a CRC error.
"""

import zipfile

import chainer
import numpy
from numpy.lib import format as npy_format

from chainermn_train.checkpoint.read import stored_zip

__all__ = ['is_cupy', 'FORMAT_KEY', 'NONE_KEY', 'META_PREFIX', 'FORMAT_VERSION', 'PickleRequired',
           'MemberTooLarge', 'to_arrays', 'write', 'write_arrays', 'read', 'read_meta', 'split_meta', 'declared_bytes',
           'member_limit', 'SMALL_MEMBER_BYTES', 'UNKNOWN_MEMBER_BYTES']

#: Reserved key holding the format version (int64 0-d array).
FORMAT_KEY = '__chainermn_format__'
#: Reserved key holding the names of the keys whose value is ``None`` (1-d unicode array).
NONE_KEY = '__chainermn_none__'
#: Prefix of the reserved keys holding the generation's metadata (plain numeric arrays).
META_PREFIX = '__chainermn_meta__/'
FORMAT_VERSION = 1
_RESERVED = (FORMAT_KEY, NONE_KEY)
_MAX_KEYS_SHOWN = 8
#: Most bytes a metadata or reserved member may declare.
SMALL_MEMBER_BYTES = 16 << 20
#: Most bytes the compressed members whose shape the target does not know (strings, Python
#: numbers, parameters not initialized yet, keys that only appear while loading) may declare
#: together; a stored (uncompressed) member may declare only what it stores.
UNKNOWN_MEMBER_BYTES = 64 << 20
#: Room for a ``.npy`` header (NumPy itself refuses headers over 10000 bytes).
_HEADER_BYTES = 1 << 16
#: Bytes per element a member may hold (complex128): its dtype may differ from the target's.
_MAX_ITEMSIZE = 16


class MemberTooLarge(ValueError):
    """Raised by :func:`read` for a member larger than the array it fills (nothing was inflated)."""


def member_limit(shape):
    """Return the most bytes a member filling an array of ``shape`` may declare."""
    count = 1
    for n in shape:
        count *= int(n)
    return _HEADER_BYTES + count * _MAX_ITEMSIZE


def declared_bytes(f):
    """Return the bytes the zip entries of ``f`` (a path or binary file) say they inflate to, in all."""
    with zipfile.ZipFile(f) as zf:
        return sum(info.file_size for info in zf.infolist())


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


def is_cupy(value):
    """Return whether ``value`` is a CuPy array (CuPy is never imported here)."""
    return type(value).__module__.split('.')[0] == 'cupy'


def _is_none(arr):
    return arr.dtype.hasobject and arr.shape == () and arr[()] is None


def to_arrays(obj, meta=None):
    """Serialize ``obj`` (or take a ready dict of values) into a dict of arrays with no object array.

    ``meta`` (a dict of numbers) is stored under :data:`META_PREFIX`.  CuPy arrays in a dict are
    kept as they are (a background save copies them into its staging buffer).
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
        arr = value if is_cupy(value) else numpy.asanyarray(value)   # CuPy: staged as it is
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
    write_arrays(f, to_arrays(obj, meta))


def write_arrays(f, arrays):
    """Write what :func:`to_arrays` returned to the binary file object ``f`` (an npz); return its size.

    The layout is ``stored_zip``'s: uncompressed ``.npy`` members, each array written from its own
    memory (no copy of it while holding the GIL).
    """
    return stored_zip.write(f, arrays)


def split_meta(values):
    """Remove the metadata keys from ``values`` (in place) and return them as a dict of numbers."""
    meta = {}
    for key in [k for k in values if k.startswith(META_PREFIX)]:
        arr = values.pop(key)
        meta[key[len(META_PREFIX):]] = arr.item() if arr.shape == () else arr
    return meta


def read_meta(path, name=None):
    """Return the metadata dict of the snapshot at ``path`` ({} for a file written without it).

    ``path`` may be a binary file object (``name``: its path, for messages).  Reads only the metadata members (each at most
    :data:`SMALL_MEMBER_BYTES`); a metadata member that needs pickle raises
    :class:`PickleRequired`.  Corrupt files raise what ``zipfile``/NumPy raise.
    """
    values = {}
    where = path if name is None else name
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            if not info.filename.startswith(META_PREFIX) or not info.filename.endswith('.npy'):
                continue
            _check_declared(where, info, SMALL_MEMBER_BYTES)
            with zf.open(info) as fp:
                if _header(fp, where, info)[2].hasobject:
                    raise PickleRequired(where, [info.filename[:-4]])
            values[info.filename[:-4]] = _read_member(zf, info, False)
    return split_meta(values)


def _check_declared(path, info, limit):
    if limit is not None and info.file_size > limit:
        raise MemberTooLarge(
            '{}: member {!r} declares {} bytes but the array it fills takes at most {}; refused '
            'before inflating it (a forged or corrupt file)'.format(
                path, info.filename[:-4], info.file_size, limit))


def _header(fp, path, info):
    """Return ``(shape, fortran, dtype)`` of the member open in ``fp``; refuse sizes that disagree."""
    version = npy_format.read_magic(fp)
    if version == (1, 0):
        header = npy_format.read_array_header_1_0(fp)
    elif version == (2, 0):
        header = npy_format.read_array_header_2_0(fp)
    else:
        header = npy_format._read_array_header(fp, version)  # 3.0: no public reader
    shape, _, dtype = header
    if not dtype.hasobject:
        count = 1
        for n in shape:
            count *= int(n)
        if fp.tell() + count * dtype.itemsize != info.file_size:
            raise MemberTooLarge(
                '{}: member {!r} says it holds {} {} ({} bytes) but its entry declares {} bytes; '
                'refused before reading it (a forged or corrupt file)'.format(
                    path, info.filename[:-4], shape, dtype,
                    count * dtype.itemsize, info.file_size - fp.tell()))
    return header


def _read_member(zf, info, allow_pickle):
    with zf.open(info) as fp:
        arr = npy_format.read_array(fp, allow_pickle=allow_pickle)
        fp.read()  # reach the end of the member so that zipfile checks its CRC
    return arr


def read(path, allow_pickle=False, limits=None, name=None, keep=None):
    """Return ``(values, pickled_keys)`` of the snapshot at ``path``; raise if it cannot be used.

    ``path`` may also be a binary file object (``name``: its path, for messages).  Metadata keys stay in ``values`` (see
    :func:`split_meta`).
    ``values`` maps every key to its array (``None`` values as 0-d object arrays, as Chainer's
    deserializer expects).  Object-dtype members raise :class:`PickleRequired` unless
    ``allow_pickle`` (then they are unpickled and listed in ``pickled_keys``).  ``limits``
    (``{key: most bytes}``, see :func:`member_limit`) bounds each member before it is inflated
    (:class:`MemberTooLarge`); the compressed members of keys it does not size may declare at
    most :data:`UNKNOWN_MEMBER_BYTES` together (a stored member must declare what it stores).
    None bounds only the metadata members.  ``keep`` (a tuple of key prefixes), when given,
    leaves every other member unread.  Truncated or corrupt files raise what ``zipfile``/NumPy raise.
    """
    values = {}
    pickled = []
    where = path if name is None else name
    with zipfile.ZipFile(path) as zf:
        infos = []
        unsized = 0
        for info in zf.infolist():
            if not info.filename.endswith('.npy'):
                raise ValueError('{}: member {!r} is not a .npy array; not a snapshot'.format(
                    where, info.filename))
            key = info.filename[:-4]
            reserved = key in _RESERVED or key.startswith(META_PREFIX)
            if keep is not None and not reserved and not key.startswith(keep):
                continue   # not wanted (e.g. the optimizer's state of a weights-only load): never read
            stored = info.compress_type == zipfile.ZIP_STORED
            if stored and info.file_size != info.compress_size:
                raise MemberTooLarge('{}: member {!r} is stored with {} bytes but its entry declares '
                                     '{}; refused (a forged or corrupt file)'.format(
                                         where, key, info.compress_size, info.file_size))
            if reserved:
                _check_declared(where, info, SMALL_MEMBER_BYTES)
            elif limits is not None and key in limits:
                _check_declared(where, info, limits[key])
            elif limits is not None and not stored:
                # Size unknown (strings, numbers, parameters not initialized yet) and inflated:
                # bounded together.  A stored member takes no more memory than the file holds.
                unsized += info.file_size
                if unsized > UNKNOWN_MEMBER_BYTES:
                    raise MemberTooLarge(
                        '{}: the compressed members whose size this job does not know (strings, '
                        'numbers, parameters not initialized yet) declare more than {} bytes '
                        'together; refused before inflating them (a forged or corrupt file)'
                        .format(where, UNKNOWN_MEMBER_BYTES))
            infos.append(info)
        for info in infos:
            with zf.open(info) as fp:
                if _header(fp, where, info)[2].hasobject:
                    pickled.append(info.filename[:-4])
        if pickled and not allow_pickle:
            raise PickleRequired(where, pickled)
        for info in infos:
            values[info.filename[:-4]] = _read_member(zf, info, allow_pickle)
    version = values.pop(FORMAT_KEY, None)
    if version is not None and (version.shape != () or version.dtype.kind not in 'iu'
                                or int(version) > FORMAT_VERSION):
        raise ValueError('{}: snapshot format {} is newer than this chainermn reads ({}); '
                         'upgrade chainermn'.format(where, version, FORMAT_VERSION))
    nones = values.pop(NONE_KEY, numpy.zeros(0, dtype='<U1'))
    if nones.dtype.kind != 'U' or nones.ndim != 1:
        raise ValueError('{}: {} must be a 1-d string array; got {} of shape {}'.format(
            where, NONE_KEY, nones.dtype, nones.shape))
    for key in nones.tolist():
        values[key] = numpy.asarray(None)
    return values, pickled
