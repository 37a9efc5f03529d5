"""What a snapshot generation records about its job, and how a job of another size resumes from it.

Every snapshot file carries metadata (see ``npz.META_PREFIX``): the world size and ranks per
node of the job that wrote it, the updater's iteration and epoch, and for each iterator of the
updater its epoch, its position as a fraction of the epoch (``epoch_detail``) and
``previous_epoch_detail``.  On a different world size the values every rank holds the same
(model, optimizer, updater, extensions) come from one snapshot file; each iterator keeps the
shard of the new job and is moved to the same epoch and the same fraction of it.  An iterator
whose class sets ``elastic = True`` keeps the state of the snapshot instead (its state does not
depend on the world size: see ``chainermn_data.iterators.create_elastic_iterator``), and so does a
multi-node iterator (one master's iterator serves every rank).
"""

import time

import chainer
import numpy
from chainermn_comm.hooks import RANK_MEAN

from chainermn_train.checkpoint.read import lineage, npz
from chainermn_train.checkpoint.reshard import state_shares

__all__ = ['generation_meta', 'iterators_of', 'iterator_prefix', 'rebuild_iterator_values',
           'expected_keys', 'byte_limits', 'fill_local', 'mismatches', 'LOCAL_PREFIXES',
           'RANK_MEAN_MARK', 'average_rank_state']


def iterators_of(obj):
    """Return ``{name: iterator}`` of the updater of ``obj`` (a Trainer or an updater), else {}."""
    updater = obj.updater if isinstance(obj, chainer.training.Trainer) else obj
    its = getattr(updater, '_iterators', None)
    return dict(its) if isinstance(its, dict) else {}


def iterator_prefix(obj, name):
    """Return the key prefix under which ``obj`` serializes its iterator ``name``."""
    if isinstance(obj, chainer.training.Trainer):
        return 'updater/iterator:{}/'.format(name)
    return 'iterator:{}/'.format(name)


def _float(value, default=None):
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def generation_meta(obj, comm, iteration):
    """Return the metadata dict written with this rank's snapshot of ``obj``."""
    meta = {'world_size': int(comm.size), 'rank': int(comm.rank),
            'ranks_per_node': int(getattr(comm, 'intra_size', 0) or 0),
            'iteration': int(iteration)}
    updater = obj.updater if isinstance(obj, chainer.training.Trainer) else obj
    epoch = getattr(updater, 'epoch', None)
    if isinstance(epoch, (int, numpy.integer)) and not isinstance(epoch, bool):
        meta['epoch'] = int(epoch)
    for name, it in iterators_of(obj).items():
        detail = _float(getattr(it, 'epoch_detail', None))
        if detail is None:
            continue
        key = 'iterator/{}/'.format(name)
        meta[key + 'epoch'] = int(getattr(it, 'epoch', int(detail)))
        meta[key + 'epoch_detail'] = detail
        meta[key + 'fraction'] = detail - int(getattr(it, 'epoch', int(detail)))
        prev = _float(getattr(it, 'previous_epoch_detail', None), -1.0)
        meta[key + 'previous_epoch_detail'] = prev
        meta[key + 'is_new_epoch'] = bool(getattr(it, 'is_new_epoch', False))
    meta.update(state_shares.partition_meta(obj, comm))   # shard_state=True: who owns which state
    return meta


def _length(it):
    for attr in ('dataset', '_dataset'):
        ds = getattr(it, attr, None)
        if ds is not None:
            try:
                return len(ds)
            except TypeError:
                pass
    return None


def rebuild_iterator_values(obj, values, meta, rank):
    """Replace the iterator entries of ``values`` (a donor's snapshot) with this rank's rebuilt state.

    Each iterator keeps its own (new) shard: its current state is serialized and its position moved
    to the snapshot's epoch and fraction of the epoch.  Iterators with ``elastic = True`` keep the
    snapshot's entries.  Returns a list of ``(name, epoch, position, length)`` of rebuilt iterators.
    Serializing an iterator may be a collective (multi-node iterators): call on every rank.
    """
    done = []
    for name, it in sorted(iterators_of(obj).items()):
        prefix = iterator_prefix(obj, name)
        if getattr(it, 'elastic', False) or hasattr(it, 'actual_iterator'):
            continue   # world-size independent state (elastic, or one master's iterator for all)
        key = 'iterator/{}/'.format(name)
        if key + 'fraction' not in meta:
            raise ValueError('rank {}: the snapshot has no position for iterator {!r} (it was written '
                             'by a job without it, or the iterator has no epoch_detail); it cannot be '
                             'moved to a shard of another size'.format(rank, name))
        ser = chainer.serializers.DictionarySerializer()
        it.serialize(ser)
        fresh = ser.target
        n = _length(it)
        if n is None or n <= 0:
            raise ValueError('rank {}: cannot rebuild iterator {!r} ({}) for the new shard: its dataset '
                             'length is unknown'.format(rank, name, type(it).__name__))
        position = int(round(float(meta[key + 'fraction']) * n))
        position = min(max(position, 0), n - 1)
        state = {'current_position': position, 'epoch': int(meta[key + 'epoch']),
                 'is_new_epoch': bool(meta[key + 'is_new_epoch']),
                 'previous_epoch_detail': float(meta[key + 'previous_epoch_detail'])}
        for k in [k for k in values if k.startswith(prefix)]:
            del values[k]
        for k, v in fresh.items():
            v = state.get(k, v)
            values[prefix + k] = numpy.asarray(v)
        done.append((name, state['epoch'], position, n))
    return done


#: Keys of state that a rank may hold alone (extensions added on rank 0 only, e.g. LogReport): on a
#: resize, a rank whose donor file lacks them keeps its own fresh values.
LOCAL_PREFIXES = ('extensions/', 'extension_triggers/')


class _KeyRecorder(chainer.serializer.Serializer):
    """Serializer that records the keys it is given, their shapes and the values of local state."""

    def __init__(self, keys, local, path=''):
        self.keys = keys
        self.local = local
        self.path = path

    def __getitem__(self, key):
        return _KeyRecorder(self.keys, self.local, self.path + key.strip('/') + '/')

    def __call__(self, key, value):
        full = self.path + key.lstrip('/')
        shape = getattr(value, 'shape', None)
        self.keys[full] = tuple(shape) if shape is not None else None
        if full.startswith(LOCAL_PREFIXES):
            if value is not None and not isinstance(value, numpy.ndarray) and hasattr(value, 'shape'):
                value = chainer.backend.CpuDevice().send(value)   # a device array
            self.local[full] = numpy.asarray(value)
        return value


def expected_keys(obj, local=None):
    """Return ``{key: shape or None}`` a snapshot of ``obj`` must hold (serializing may be a collective).

    ``local`` (a dict), when given, receives the current values of the keys under
    :data:`LOCAL_PREFIXES`.
    """
    if isinstance(obj, dict):
        return {k: getattr(v, 'shape', None) for k, v in obj.items()}
    keys = {}
    unstarted = isinstance(obj, chainer.training.Trainer) and not obj._done and obj._start_at is None
    if unstarted:  # a Trainer refuses to report its elapsed time before it runs
        obj._start_at = time.perf_counter()
    try:
        obj.serialize(_KeyRecorder(keys, local if local is not None else {}))
    finally:
        if unstarted:
            obj._start_at = None
    _add_optimizer_state(obj, keys)
    return keys


def _add_optimizer_state(obj, keys):
    """Add the state keys an optimizer without state yet asks for while loading (Adam's m and v)."""
    parts = state_shares.own_paths(obj)
    for name, (prefix, opt) in lineage.optimizers_of(obj).items():
        names = None
        mine = parts.get(name)
        for path, param in sorted(opt.target.namedparams()):
            rule = getattr(param, 'update_rule', None)
            if rule is None or rule.state is not None or not rule.enabled:
                continue   # a rule with state was recorded by serializing it
            if mine is not None and path.strip('/') not in mine:
                continue   # shard_state=True: another rank owns (and loads) this state
            if names is None:
                names = lineage.state_keys(opt) or []
            shape = None if param.array is None else tuple(param.array.shape)
            for name in names:
                keys['{}{}/{}'.format(prefix, path.strip('/'), name)] = shape


def byte_limits(expected):
    """Return ``{key: most bytes its member may declare}`` for the keys of ``expected`` of known shape."""
    return {k: npz.member_limit(shape) for k, shape in (expected or {}).items()
            if shape is not None}


def fill_local(values, local):
    """Add to ``values`` the rank-local keys it lacks, with this rank's current values; return them."""
    added = sorted(k for k in local if k not in values)
    for k in added:
        values[k] = local[k]
    return added


def mismatches(expected, values):
    """Return what makes ``values`` unfit for a target of ``expected`` keys and shapes, or None."""
    expected = expected or {}
    missing = sorted(k for k in expected if k not in values)
    if missing:
        return 'lacks {} key(s) this job needs: {}'.format(len(missing), ', '.join(missing[:8]))
    wrong = sorted('{} has shape {} but this job has {}'.format(k, tuple(values[k].shape), shape)
                   for k, shape in expected.items()
                   if shape is not None and getattr(values[k], 'shape', shape) != shape
                   and not (values[k].dtype.hasobject and values[k].shape == ()))
    if wrong:
        more = ' and {} more'.format(len(wrong) - 2) if len(wrong) > 2 else ''
        return 'holds arrays of another shape (another model?): {}{}'.format('; '.join(wrong[:2]), more)
    return None


#: Where a communication hook's state lives in a snapshot (saved by the multi-node optimizer); what
#: it keeps below a ``rank_mean/`` key there (``.../comm_hook/[...]/rank_mean/...``) is per rank: on
#: a resize every new rank takes the mean of the old ranks' values.
RANK_MEAN_MARK = '/comm_hook/'


def _rank_mean_key(key):
    tail = ('/' + key).partition(RANK_MEAN_MARK)[2]
    return bool(tail) and '/{}/'.format(RANK_MEAN) in '/' + tail


def average_rank_state(comm, ranks, values, read):
    """Replace the per-rank hook state in ``values`` by its mean over the old ranks' files (collective).

    ``ranks`` lists ``(old rank, the rank that reads its file)``; ``read(old rank)`` returns that
    file's values (called on the reading rank only).  A file that cannot be read, or whose arrays
    have other shapes, is left out of the mean.  Returns the number of files averaged (0: no such
    state, ``values`` unchanged).
    """
    keys = sorted(k for k in values if _rank_mean_key(k))
    if not keys:
        return 0
    shapes = [numpy.shape(values[k]) for k in keys]
    total = numpy.zeros(sum(int(numpy.prod(s)) for s in shapes), dtype=numpy.float64)
    count = 0
    for old, reader in ranks:
        if reader != comm.rank:
            continue
        try:
            theirs = read(old)
            parts = [numpy.asarray(theirs[k], dtype=numpy.float64).reshape(-1) for k in keys]
        except Exception:  # unreadable: the others' mean is still the best estimate
            continue
        if [p.size for p in parts] != [int(numpy.prod(s)) for s in shapes]:
            continue
        total += numpy.concatenate(parts)
        count += 1
    total = comm.allreduce(total)
    count = comm.allreduce_obj(count)
    if count == 0:
        return 0
    off = 0
    for k, shape in zip(keys, shapes):
        n = int(numpy.prod(shape))
        values[k] = (total[off:off + n] / count).reshape(shape).astype(values[k].dtype)
        off += n
    return count
