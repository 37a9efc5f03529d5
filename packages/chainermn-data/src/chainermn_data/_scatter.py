"""scatter_dataset: root sends every rank only its own part of a dataset, in bounded pieces."""

import operator
import pickle
import zlib

import numpy
from chainer.datasets import SubDataset
from chainermn_comm import run_facts, voice

from chainermn_data._comm import describe, guarded, mpi_comm_of

__all__ = ['scatter_dataset', 'MAX_BUF_LEN_LIMIT', 'part_positions']

#: Largest ``max_buf_len`` accepted (the largest count of one MPI message).
MAX_BUF_LEN_LIMIT = 2147483647

_TAG_DATA = 31
_TAG_ERROR = 32
_LEN = 8  # bytes of the length prefix of every pickled sample in the stream

_EXC = {'type': TypeError, 'value': ValueError, 'runtime': RuntimeError}


def part_positions(n, size, rank, force_equal_length=True):
    """Return the positions (in the scatter order) of the samples ``rank`` receives out of ``n``.

    The order is cut into ``size`` consecutive blocks whose lengths differ by at most one
    (the first ``n % size`` blocks are one longer).  With ``force_equal_length`` every rank takes
    ``ceil(n / size)`` consecutive positions from the start of its block, wrapping around at the end,
    so a short rank repeats the first sample of the next rank's block (the last rank repeats
    the very first sample).
    """
    q, rem = divmod(n, size)
    start = rank * q + min(rank, rem)
    own = q + (1 if rank < rem else 0)
    count = (q + (1 if rem else 0)) if force_equal_length else own
    if n == 0 or count == 0:
        return numpy.empty(0, dtype=numpy.int64)
    return (start + numpy.arange(count, dtype=numpy.int64)) % n


def scatter_dataset(dataset, comm, root=0, shuffle=False, seed=None, max_buf_len=256 * 1024 * 1024,
                    force_equal_length=True):
    """Scatter root's dataset: every rank receives only its own part, as a ``SubDataset``.

    Collective: every rank of ``comm`` (a ChainerMN or mpi4py communicator) must call it with the same
    ``root`` and ``force_equal_length``.  The ``dataset``, ``shuffle`` and ``seed`` of ranks other than
    ``root`` are ignored (they may pass ``None``).  The order (identity, or
    ``numpy.random.RandomState(seed).permutation(len(dataset))`` when ``shuffle``) is cut into
    ``comm.size`` consecutive blocks whose lengths differ by at most one; see :func:`part_positions`
    for which samples are repeated so that every rank gets the same length (``force_equal_length``).
    Each part travels from root to its rank alone, in messages of at most ``max_buf_len`` bytes.
    Root's own part is a view of its dataset (nothing is copied); other ranks hold their samples.
    How the data was cut (length, ``shuffle``, ``seed`` and a CRC-32 of the order) is noted in
    ``chainermn_comm.run_facts``: the checkpointer records it, and a resumed job whose order
    differs (``shuffle=True`` without a ``seed``, or another seed) is warned that its shards differ.
    """
    mpi = mpi_comm_of(comm)
    rank, size = mpi.Get_rank(), mpi.Get_size()
    problem = _check_args(rank, size, root, max_buf_len)
    sig = (('root', root if isinstance(root, int) else repr(root)),
           ('force_equal_length', bool(force_equal_length)))
    with guarded(comm, 'scatter_dataset', sig):
        work = mpi.Dup()
        try:
            return _scatter(work, rank, size, dataset, root, shuffle, seed, max_buf_len,
                            bool(force_equal_length), problem)
        finally:
            work.Free()


def _check_args(rank, size, root, max_buf_len):
    if isinstance(root, bool) or not isinstance(root, (int, numpy.integer)) or not 0 <= root < size:
        return 'root must be an int rank in [0, {}); got {!r}'.format(size, root)
    if isinstance(max_buf_len, bool) or not isinstance(max_buf_len, (int, numpy.integer)):
        return 'max_buf_len must be an int number of bytes; got {!r}'.format(max_buf_len)
    if max_buf_len <= 0:
        return 'max_buf_len must be positive; got {}'.format(max_buf_len)
    if max_buf_len > MAX_BUF_LEN_LIMIT:
        return ('max_buf_len must not be larger than {} (the largest MPI message count); got {}. '
                'Larger parts are sent in several pieces anyway.'.format(MAX_BUF_LEN_LIMIT, max_buf_len))
    return None


def _raise_all(work, rank, what, problems, kind='value'):
    detail = '; '.join('rank {}: {}'.format(r, p) for r, p in problems)
    # Every rank raises it after the same exchange: rank 0 reports it (chainermn_comm.voice).
    raise voice.agreed(_EXC[kind]('rank {}: scatter_dataset {}: {}'.format(rank, what, detail)), work)


def _scatter(work, rank, size, dataset, root, shuffle, seed, max_buf_len, force_equal_length, problem):
    # 1. Every rank checks its own arguments; all ranks raise together on any problem.
    everyone = work.allgather((problem, int(root) if problem is None else None, force_equal_length,
                               dataset is not None))
    bad = [(r, e[0]) for r, e in enumerate(everyone) if e[0] is not None]
    if bad:
        _raise_all(work, rank, 'got invalid arguments', bad)
    roots = {e[1] for e in everyone}
    flags = {e[2] for e in everyone}
    if len(roots) != 1 or len(flags) != 1:
        _raise_all(work, rank, 'needs the same root and force_equal_length on every rank', [
            (r, 'root={} force_equal_length={}'.format(e[1], e[2])) for r, e in enumerate(everyone)])
    root = int(root)
    if not everyone[root][3]:
        holders = [r for r, e in enumerate(everyone) if e[3]]
        _raise_all(work, rank, 'got dataset=None on its root', [(root, (
            'root {} passed dataset=None{}. scatter_dataset reads only the root\'s data set: load it '
            'on rank {} (e.g. train = get_mnist()[0] if comm.rank == {} else None){}'.format(
                root, '; rank(s) {} passed one'.format(', '.join(map(str, holders))) if holders else '',
                root, root, ', or pass root=R for the rank R that loaded it' if holders else '')))])

    # 2. Root plans the split and tells every rank what it will receive (and how it cut the data).
    order, fact = None, None
    if rank == root:
        try:
            header, order = _plan(dataset, size, root, shuffle, seed, max_buf_len, force_equal_length)
            fact = _fact(header[1], shuffle, seed, order)
        except _PlanError as e:
            header = ('error', e.kind, str(e))
    else:
        header = None
    header, fact = work.bcast((header, fact), root=root)
    if header[0] == 'error':
        _raise_all(work, rank, 'failed on root', [(root, header[2])], kind=header[1])
    kind, n, max_piece = header[0], header[1], header[2]
    positions = part_positions(n, size, rank, force_equal_length)

    # 3. Root streams each part to its rank; the others receive theirs.
    if rank == root:
        failure = _send_parts(work, root, size, dataset, order, n, kind, max_piece, force_equal_length)
        result = _root_view(dataset, order, n, positions)
    else:
        result, failure = _receive_part(work, root, kind, header, len(positions), max_piece)

    # 4. Every rank learns whether anything failed anywhere, so nobody is left waiting.
    outcome = work.allgather(failure)
    failed = []
    for r, f in enumerate(outcome):
        if f is not None and f[1] not in [m for _, m in failed]:
            failed.append((r, f[1]))
    if failed:
        kinds = [f[0] for f in outcome if f is not None]
        _raise_all(work, rank, 'failed', failed, kind=kinds[0])
    run_facts.note(run_facts.SCATTER, fact)   # a checkpoint records it; a resume compares it
    return result


def _fact(n, shuffle, seed, order):
    """Return how root cut the data: length, shuffle, the seed (an int, or None) and a CRC of the order."""
    try:
        given = None if seed is None else int(operator.index(seed))
    except TypeError:   # a sequence or array of seeds: the order's CRC still tells runs apart
        given = None
    crc = None if order is None else zlib.crc32(numpy.ascontiguousarray(order, dtype='<i8').tobytes())
    return {'n': int(n), 'shuffle': bool(shuffle), 'seeded': seed is not None, 'seed': given,
            'order': crc}


class _PlanError(Exception):
    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


def _plan(dataset, size, root, shuffle, seed, max_buf_len, force_equal_length):
    if dataset is None:
        raise _PlanError('value', 'root {} passed dataset=None; root must pass the dataset to scatter'
                         .format(root))
    try:
        n = len(dataset)
    except Exception as e:
        raise _PlanError('type', 'the dataset ({}) needs __len__ and __getitem__: {}: {}'.format(
            describe(dataset), type(e).__name__, e))
    order = None
    if shuffle:
        try:
            order = numpy.random.RandomState(seed).permutation(n)
        except (TypeError, ValueError) as e:
            raise _PlanError('value', 'seed={!r} cannot seed numpy.random.RandomState (use an int in '
                                      '[0, 2**32) or None): {}'.format(seed, e))
    if isinstance(dataset, numpy.ndarray) and dataset.ndim >= 1 and not dataset.dtype.hasobject:
        header = ('array', n, int(max_buf_len), dataset.dtype, tuple(dataset.shape[1:]))
        return header, order
    own = part_positions(n, size, root, force_equal_length)
    if len(own):
        # Root keeps its own part unpickled; pickling one sample makes a dataset whose samples
        # cannot be pickled fail the same way at any number of ranks.
        index = int(own[0] if order is None else order[own[0]])
        _pickle_sample(dataset, index)
    return ('pickle', n, int(max_buf_len)), order


def _pickle_sample(dataset, index):
    try:
        sample = dataset[index]
    except Exception as e:
        raise _PlanError('runtime', 'reading sample {} of the dataset ({}) raised {}: {}'.format(
            index, describe(dataset), type(e).__name__, e))
    try:
        return pickle.dumps(sample, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        raise _PlanError('type', 'sample {} of the dataset ({}) cannot be pickled: it is a {}: {}: {}. '
                                 'Every sample must be picklable (arrays, numbers, tuples, dicts, ...) '
                                 'to be sent to other ranks.'.format(
                                     index, describe(dataset), describe(sample), type(e).__name__, e))


def _indices(order, positions):
    return positions if order is None else order[positions]


def _root_view(dataset, order, n, positions):
    if n == 0:
        return SubDataset(dataset, 0, 0)
    count = len(positions)
    start = int(positions[0]) if count else 0
    if order is None and start + count <= n:
        return SubDataset(dataset, start, start + count)
    base = numpy.arange(n) if order is None else order
    return SubDataset(dataset, 0, count, order=numpy.roll(base, -start))


def _send_parts(work, root, size, dataset, order, n, kind, max_piece, force_equal_length):
    """Send each rank its part; return None, or (kind, message) after telling the receivers."""
    dests = [d for d in range(size) if d != root]
    for k, dest in enumerate(dests):
        indices = _indices(order, part_positions(n, size, dest, force_equal_length))
        try:
            if kind == 'array':
                _send_array_part(work, dest, dataset, indices, max_piece)
            else:
                _send_pickled_part(work, dest, dataset, indices, max_piece)
        except _PlanError as e:
            message = 'rank {}\'s part: {}'.format(dest, e)
            for other in dests[k:]:
                work.send((e.kind, message), dest=other, tag=_TAG_ERROR)
            return (e.kind, message)
    return None


def _consecutive(indices):
    return len(indices) > 0 and int(indices[-1]) - int(indices[0]) == len(indices) - 1 and \
        bool(numpy.all(numpy.diff(indices) == 1))


def _send_array_part(work, dest, dataset, indices, max_piece):
    from mpi4py import MPI
    row_bytes = dataset.dtype.itemsize * int(numpy.prod(dataset.shape[1:], dtype=numpy.int64))
    if row_bytes == 0 or len(indices) == 0:
        return
    rows = max(1, max_piece // row_bytes)
    for start in range(0, len(indices), rows):
        chunk = indices[start:start + rows]
        if _consecutive(chunk) and dataset.flags.c_contiguous:
            block = dataset[int(chunk[0]):int(chunk[-1]) + 1]  # a view: nothing copied
        else:
            block = numpy.ascontiguousarray(dataset[chunk])
        raw = block.reshape(-1).view(numpy.uint8)
        for off in range(0, raw.size, max_piece):
            work.Send([raw[off:off + max_piece], MPI.BYTE], dest=dest, tag=_TAG_DATA)
        del block, raw


class _PieceWriter:
    """Cut a byte stream into messages of exactly ``max_piece`` bytes (the last may be shorter)."""

    def __init__(self, work, dest, max_piece):
        self.work, self.dest, self.max_piece = work, dest, max_piece
        self.buf = bytearray()

    def write(self, data):
        from mpi4py import MPI
        view = memoryview(data).cast('B')
        while len(view):
            if not self.buf and len(view) >= self.max_piece:
                self.work.Send([view[:self.max_piece], MPI.BYTE], dest=self.dest, tag=_TAG_DATA)
                view = view[self.max_piece:]
                continue
            take = min(len(view), self.max_piece - len(self.buf))
            self.buf += view[:take]
            view = view[take:]
            if len(self.buf) == self.max_piece:
                self.flush()

    def flush(self):
        from mpi4py import MPI
        if self.buf:
            self.work.Send([self.buf, MPI.BYTE], dest=self.dest, tag=_TAG_DATA)
            self.buf = bytearray()

    def end(self):
        """Flush and send the empty message that ends the part."""
        from mpi4py import MPI
        self.flush()
        self.work.Send([bytearray(), MPI.BYTE], dest=self.dest, tag=_TAG_DATA)


def _send_pickled_part(work, dest, dataset, indices, max_piece):
    writer = _PieceWriter(work, dest, max_piece)
    for index in indices:
        data = _pickle_sample(dataset, int(index))
        writer.write(len(data).to_bytes(_LEN, 'little'))
        writer.write(data)
        del data
    writer.end()


def _receive_part(work, root, kind, header, count, max_piece):
    """Receive this rank's part; return (SubDataset or None, None or (kind, message))."""
    if kind == 'array':
        return _receive_array_part(work, root, header, count, max_piece)
    return _receive_pickled_part(work, root, count)


def _probe_error(work, root, status):
    """Wait for root's next message; return its (kind, message) if it is an error report, else None."""
    from mpi4py import MPI
    work.Probe(source=root, tag=MPI.ANY_TAG, status=status)
    if status.Get_tag() == _TAG_ERROR:
        return work.recv(source=root, tag=_TAG_ERROR)
    return None


def _receive_array_part(work, root, header, count, max_piece):
    from mpi4py import MPI
    dtype, row_shape = numpy.dtype(header[3]), header[4]
    out = numpy.empty((count,) + tuple(row_shape), dtype=dtype)
    raw = out.reshape(-1).view(numpy.uint8)
    status = MPI.Status()
    off = 0
    while off < raw.size:
        error = _probe_error(work, root, status)
        if error is not None:
            return None, error
        piece = raw[off:off + min(max_piece, raw.size - off)]
        work.Recv([piece, MPI.BYTE], source=root, tag=_TAG_DATA, status=status)
        off += status.Get_count(MPI.BYTE)
    return SubDataset(out, 0, count), None


def _receive_pickled_part(work, root, count):
    from mpi4py import MPI
    status = MPI.Status()
    samples = []
    pending = bytearray()
    failure = None
    while True:
        error = _probe_error(work, root, status)
        if error is not None:
            return None, error
        size = status.Get_count(MPI.BYTE)
        old = len(pending)
        if old:
            pending.extend(bytearray(size))
        else:
            pending = bytearray(size)
        with memoryview(pending) as view:
            work.Recv([view[old:], MPI.BYTE], source=root, tag=_TAG_DATA)
        if size == 0:
            break
        if failure is None:
            try:
                used = _parse(pending, samples)
            except Exception as e:
                failure = ('type', 'could not unpickle sample {} of this rank\'s part: {}: {}. The '
                                   'classes of the samples must be importable on every rank.'.format(
                                       len(samples), type(e).__name__, e))
                used = len(pending)
            del pending[:used]
        else:
            del pending[:]
    if failure is None and (pending or len(samples) != count):
        failure = ('runtime', 'received {} samples ({} stray bytes) but expected {}; root and this rank '
                              'are out of step'.format(len(samples), len(pending), count))
    if failure is not None:
        return None, failure
    return SubDataset(samples, 0, count), None


def _parse(pending, samples):
    """Unpickle every complete sample at the front of ``pending``; return the bytes consumed.

    Safe: the bytes come over MPI from the root rank of this job, which pickled its own samples.
    """
    pos = 0
    total = len(pending)
    with memoryview(pending) as view:
        while total - pos >= _LEN:
            length = int.from_bytes(view[pos:pos + _LEN], 'little')
            if total - pos - _LEN < length:
                break
            samples.append(pickle.loads(view[pos + _LEN:pos + _LEN + length]))
            pos += _LEN + length
    return pos
