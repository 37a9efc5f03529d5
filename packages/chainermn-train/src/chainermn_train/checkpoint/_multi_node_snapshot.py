"""multi_node_snapshot: one rank per replica set writes snapshots, all of them load the same state.

Chainer's ``snapshot(autoload=True)`` loads with pickle on and trusts whatever file is newest in
``trainer.out``.  Here the autoload is done by chainermn instead: the directory must be this
user's and writable by nobody else, the newest file must be a regular file of this user, it is
read by the pickle-free, bounded reader of the checkpointer (``read.npz``), and any failure is
raised on every rank together.  Chainer's default writer (``save_npz`` through a
``SimpleWriter``) is replaced by one that writes through ``chainermn_comm.safe_files`` without
pickle; a writer or ``savefun`` of your own is left as it is.  ``CHAINERMN_TRUST_SHARED=1``
and ``CHAINERMN_ALLOW_PICKLE=1`` opt in, as for the checkpointer.
"""

import os
import stat

import numpy
from chainer import serializers
from chainer.serializers import npz as chainer_npz
from chainer.training import extension
from chainer.training.extensions import snapshot_writers

from chainermn_comm import safe_files, trace

from chainermn_train.checkpoint.ownership import trust
from chainermn_train.checkpoint.read import npz
from chainermn_train.checkpoint.reshard import resize

__all__ = ['multi_node_snapshot', 'parse_replica_sets', 'SafeWriter', 'latest_snapshot']

#: Tag of the messages that carry a loaded snapshot from a replica set's master to its members.
_TAG = 0x4D4E53


def parse_replica_sets(replica_sets, size):
    """Return the replica sets as sorted lists of ranks covering 0..size-1 (the rest is one more set).

    Each item is a rank or an iterable of ranks; ranks must lie in [0, size) and appear once.
    """
    sets = []
    seen = {}
    for i, item in enumerate(replica_sets):
        ranks = [item] if isinstance(item, (int, numpy.integer)) else list(item)
        for r in ranks:
            if isinstance(r, bool) or not isinstance(r, (int, numpy.integer)) or not 0 <= r < size:
                raise ValueError('replica set {} ({!r}) names rank {!r}, but ranks are 0..{}'.format(
                    i, item, r, size - 1))
            if int(r) in seen:
                raise ValueError('rank {} appears in replica set {} and in replica set {}; each rank '
                                 'belongs to one set'.format(int(r), seen[int(r)], i))
            seen[int(r)] = i
        if ranks:
            sets.append(sorted(int(r) for r in ranks))
    rest = [r for r in range(size) if r not in seen]
    if rest:
        sets.append(rest)
    return sets


def latest_snapshot(fmt, outdir):
    """Return the newest file of ``outdir`` named like ``fmt`` (its text before the first ``{`` and
    after the last ``}``, as Chainer's autoload matches), or None; links are not followed."""
    prefix, suffix = fmt.split('{')[0], fmt.split('}')[-1]
    newest = None
    try:
        entries = os.listdir(outdir)
    except FileNotFoundError:
        return None
    for fn in entries:
        if fn.startswith(prefix) and fn.endswith(suffix):
            st = os.lstat(os.path.join(outdir, fn))
            if stat.S_ISDIR(st.st_mode):
                continue   # Chainer's writers work in temporary directories
            if newest is None or (st.st_mtime, fn) > newest:
                newest = (st.st_mtime, fn)
    return None if newest is None else os.path.join(outdir, newest[1])


class SafeWriter(snapshot_writers.Writer):
    """Chainer snapshot writer that writes pickle-free npz through ``chainermn_comm.safe_files``."""

    def __call__(self, filename, outdir, target):
        # Only the writing rank gets here, so a directory it cannot make or trust is its own error:
        # raised here (the job then ends through the rules for a rank that leaves), no collective.
        safe_files.make_directory(outdir, 'snapshot directory')
        with safe_files.atomic_write(os.path.join(outdir, filename)) as f:
            npz.write(f, target)
        self._post_save()


def _default_writer(snapshot):
    writer = getattr(snapshot, 'writer', None)
    return type(writer) is snapshot_writers.SimpleWriter and \
        writer._savefun is chainer_npz.save_npz and not writer._kwds


def _read_latest(fmt, outdir, target, limits, rank):
    """Load the newest snapshot into ``target``; return ``(loaded path or None, problem or None)``."""
    try:
        safe_files.check_directory(outdir, 'snapshot directory')
        path = latest_snapshot(fmt, outdir)
        if path is None:
            return None, None
        allowed, how = trust.allow_pickle(None)
        with safe_files.open_trusted(path, 'snapshot') as f:
            values, pickled = npz.read(f, allow_pickle=allowed, limits=limits, name=path)
        if pickled:
            trust.warn_pickle_once(rank, path, pickled, how)
        npz.split_meta(values)
        serializers.NpzDeserializer(values).load(target)
        return path, None
    except npz.PickleRequired as e:
        return None, trust.UnsafeCheckpointError(
            'refusing to load the snapshot: {}. Nothing was loaded. {}'.format(e, trust.OPT_IN_HINT))
    except safe_files.UntrustedPathError as e:
        return None, e
    except Exception as e:
        return None, trust.SnapshotUnusableError(
            'cannot load the newest snapshot in {} ({}: {}); nothing was loaded. Fix or remove '
            'it.'.format(outdir, type(e).__name__, e))


class _MultiNodeSnapshot(extension.Extension):
    """Wrap a ``chainer.training.extensions.snapshot`` so that it runs once per replica set."""

    def __init__(self, comm, snapshot, replica_sets):
        self.comm = comm
        self.snapshot = snapshot
        self.replica_sets = parse_replica_sets(replica_sets, comm.size)
        self.replica_set = next(s for s in self.replica_sets if comm.rank in s)
        self.master = self.replica_set[0]
        # Every set's master writes files of its own name: '<filename>.<master rank>'.
        filename = snapshot.filename
        if callable(filename):
            snapshot.filename = lambda trainer: '{}.{}'.format(filename(trainer), self.master)
        else:
            snapshot.filename = '{}.{}'.format(filename, self.master)
        if _default_writer(snapshot):
            snapshot.writer = SafeWriter()   # the same npz, without pickle, never through a planted name
        self.trigger = snapshot.trigger
        self.priority = snapshot.priority
        self.name = getattr(snapshot, 'name', None)

    @property
    def is_master(self):
        """Whether this rank writes the snapshots of its replica set."""
        return self.comm.rank == self.master

    @property
    def default_name(self):
        return self.snapshot.default_name

    def initialize(self, trainer):
        """Let the master load safely, then give the loaded state to the rest of its replica set."""
        with trace.span('snapshot load', 'io'):
            self._initialize(trainer)

    def _initialize(self, trainer):
        # Chainer's autoload cannot search for files named by a function: nothing to load then.
        autoload = getattr(self.snapshot, 'autoload', False) and isinstance(self.snapshot.filename, str)
        target = getattr(self.snapshot, '_target', None)
        target = trainer if target is None else target
        limits = resize.byte_limits(resize.expected_keys(target)) if autoload else None
        found, problem = None, None
        if self.is_master:
            if autoload:
                found, problem = _read_latest(self.snapshot.filename, trainer.out, target, limits,
                                              self.comm.rank)
            wanted, self.snapshot.autoload = self.snapshot.autoload, False   # Chainer's unpickles
            try:
                self.snapshot.initialize(trainer)
            finally:
                self.snapshot.autoload = wanted
        trust.agree(self.comm, problem)
        if not autoload or len(self.replica_set) == 1:
            return
        if self.is_master:
            state = None
            if found:
                ser = serializers.DictionarySerializer()
                ser.save(target)
                state = ser.target
            for rank in self.replica_set[1:]:
                self.comm.send_obj(state, dest=rank, tag=_TAG)
        else:
            state = self.comm.recv_obj(self.master, tag=_TAG)
            if state is not None:
                serializers.NpzDeserializer(state).load(target)

    def __call__(self, trainer):
        # Not a collective: only masters write. Chainer's ``snapshot`` decides whether to write
        # (its condition) and its writer touches ``trainer.out`` only then (SafeWriter checks it).
        if self.is_master:
            with trace.span('snapshot', 'io'):
                self.snapshot(trainer)

    def on_error(self, trainer, exc, tb):
        if self.is_master:
            self.snapshot.on_error(trainer, exc, tb)

    def finalize(self):
        if self.is_master:
            self.snapshot.finalize()


def multi_node_snapshot(comm, snapshot, replica_sets):
    """Return a trainer extension that takes ``snapshot`` once per replica set and loads it everywhere.

    ``replica_sets`` lists groups of ranks that hold the same state (a rank, or an iterable of
    ranks, per group); ranks not listed form one more group, so ``[0]`` means ``{0}`` and
    ``{1, ..., size-1}``, and ``[]`` means all ranks. The lowest rank of each group (its master)
    runs ``snapshot``, whose file names get ``.<master rank>`` appended. With ``autoload=True`` the
    master loads its newest file at start, if there is one, and sends the loaded state to the other
    ranks of its group, so a resumed job starts identically on every rank of a group, whatever
    ``comm.size`` is now. ``snapshot`` is a :func:`chainer.training.extensions.snapshot`
    extension. Collective at start (``initialize``): register it on every rank.
    """
    return _MultiNodeSnapshot(comm, snapshot, replica_sets)
