"""multi_node_snapshot: one rank per replica set writes snapshots, all of them load the same state."""

import os

import numpy
from chainer import serializers
from chainer.training import extension

from chainermn_comm import trace

__all__ = ['multi_node_snapshot', 'parse_replica_sets']

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


def _snapshot_exists(filename, outdir):
    """Whether the snapshot's autoload will find a file (asked the way Chainer's autoload asks)."""
    try:
        from chainer.training.extensions._snapshot import _find_latest_snapshot
    except ImportError:  # another Chainer: assume a file, so that the replicas follow the master
        return True
    return os.path.isdir(outdir) and _find_latest_snapshot(filename, outdir) is not None


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
        """Let the master (auto)load, then give the loaded state to the rest of its replica set."""
        with trace.span('snapshot load', 'io'):
            self._initialize(trainer)

    def _initialize(self, trainer):
        autoload = getattr(self.snapshot, 'autoload', False)
        if self.is_master:
            found = autoload and _snapshot_exists(self.snapshot.filename, trainer.out)
            self.snapshot.initialize(trainer)
        if not autoload or len(self.replica_set) == 1:
            return
        target = getattr(self.snapshot, '_target', None)
        target = trainer if target is None else target
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
