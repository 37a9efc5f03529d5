"""Sharded optimizer state in snapshots: the partition each file records, and gathering the shares.

A job made with ``create_multi_node_optimizer(..., shard_state=True)`` saves on each rank only the
state of the parameters that rank owns (see ``chainermn_train._sharded``); every file of the
generation records the partition (metadata key ``sharded/<optimizer name>``, JSON: the world size
and the owner rank of each parameter path).  A job that resumes with the same partition (the
same number of ranks, sharded) loads each rank's own file, bit for bit.  Any other job (another
number of ranks, or an unsharded optimizer) gathers the shares: for every old rank, one rank that
can read its file (the rank of the same number first) sends that file's share of the state (the
update rules' state and step count ``t`` of the parameters it owned) to every rank, and each rank
keeps what its own optimizer needs (every parameter's, unsharded; its new share, sharded).  A
generation whose share files are not all readable (node-local disks of a lost node) is refused
naming the files and the parameters whose state they held; the loader then falls back to an
older generation.
"""

import io
import json

import numpy
from chainermn_comm import safe_files

from chainermn_train.checkpoint.read import lineage, npz

__all__ = ['META_PREFIX', 'partition_meta', 'recorded', 'job_partitions', 'own_paths', 'needs_gather',
           'without_state', 'missing_files', 'describe_missing', 'gather', 'owned_paths']

#: Metadata key prefix of a sharded optimizer's partition (``sharded/<optimizer name>``).
META_PREFIX = 'sharded/'


def _updater_of(obj):
    import chainer
    if isinstance(obj, chainer.training.Trainer):
        return obj.updater
    return obj if hasattr(obj, 'get_all_optimizers') else None


def _sharded_optimizers(obj):
    """Return ``{name: (key prefix, ShardedUpdate or None)}`` of the updater of ``obj``."""
    updater = _updater_of(obj)
    if updater is None:
        return {}
    prefixes = lineage.optimizers_of(obj)
    return {name: (prefixes[name][0], getattr(opt, '_mn_shard', None))
            for name, opt in sorted(updater.get_all_optimizers().items()) if name in prefixes}


def _partition_of(shard, size):
    shard.layout()   # local: recomputed only when the model's parameters changed
    return {'world_size': int(size),
            'owners': {n.strip('/'): int(r) for n, r in zip(shard.names, shard.owners)}}


def partition_meta(obj, comm):
    """Return the metadata entries recording each sharded optimizer's partition ({} when none)."""
    out = {}
    for name, (_, shard) in _sharded_optimizers(obj).items():
        if shard is not None:
            out[META_PREFIX + name] = json.dumps(_partition_of(shard, comm.size), sort_keys=True)
    return out


def recorded(files):
    """Return ``{optimizer name: {'world_size', 'owners'}}`` a generation recorded ({}: none sharded).

    ``files`` is ``{rank: [(seen_by, meta)]}``; every rank sees the same, so decides the same.
    """
    for _, seen in sorted(files.items()):
        for _, m in seen:
            if not isinstance(m, dict) or 'world_size' not in m:
                continue
            out = {}
            for key, text in m.items():
                if not key.startswith(META_PREFIX) or not isinstance(text, str):
                    continue
                try:
                    part = json.loads(text)
                    owners = {str(p): int(r) for p, r in part['owners'].items()}
                    out[key[len(META_PREFIX):]] = {'world_size': int(part['world_size']),
                                                   'owners': owners}
                except (ValueError, KeyError, TypeError, AttributeError):
                    continue
            return out
    return {}


def job_partitions(obj, comm):
    """Return ``{optimizer name: partition or None (unsharded)}`` of this job."""
    return {name: None if shard is None else _partition_of(shard, comm.size)
            for name, (_, shard) in _sharded_optimizers(obj).items()}


def own_paths(obj):
    """Return ``{optimizer name: parameter paths this rank owns}`` of this job's sharded optimizers."""
    out = {}
    for name, (_, shard) in _sharded_optimizers(obj).items():
        if shard is not None:
            shard.layout()
            out[name] = {n.strip('/') for n, r in zip(shard.names, shard.owners)
                         if r == shard.comm.rank}
    return out


def needs_gather(rec, mine):
    """Return whether a generation of partitions ``rec`` must be gathered for a job of ``mine``."""
    return any(name in mine and mine[name] != part for name, part in rec.items())


def owned_paths(part, rank):
    """Return the parameter paths ``part`` gives to ``rank``."""
    return sorted(p for p, r in part['owners'].items() if r == rank)


def _state_prefixes(obj, rec):
    prefixes = lineage.optimizers_of(obj)
    return {name: prefixes[name][0] for name in rec if name in prefixes}


def without_state(expected, obj, rec):
    """Return ``expected`` without the optimizer state keys that gathering the shares supplies."""
    roots = tuple('{}{}/'.format(pre, path) for name, pre in _state_prefixes(obj, rec).items()
                  for path in rec[name]['owners'])
    if not roots:
        return expected
    return {k: v for k, v in expected.items() if not k.startswith(roots)}


def missing_files(files, rec):
    """Return ``[(old rank, [optimizer name/parameter paths])]`` of share files no rank can see."""
    size = max((p['world_size'] for p in rec.values()), default=0)
    out = []
    for r in range(size):
        if not any(isinstance(m, dict) for _, m in files.get(r, ())):
            out.append((r, ['{}:{}'.format(n, p) for n in sorted(rec) for p in owned_paths(rec[n], r)]))
    return out


def describe_missing(ckpt, it, missing):
    """Return why a sharded generation with share files nobody can read cannot be loaded."""
    parts = []
    for r, paths in missing:
        shown = ', '.join(paths[:6]) + (' and {} more'.format(len(paths) - 6) if len(paths) > 6 else '')
        parts.append('{} (the optimizer state of {} parameter(s): {})'.format(
            ckpt.filename(it, r), len(paths), shown or 'none'))
    return ('it holds sharded optimizer state (shard_state=True) and no rank of this job can read '
            'the share file(s) {}: each rank\'s file holds only the state of the parameters it '
            'owned, so without them that state is lost (on node-local disks, copy them to a disk '
            'this job reaches)'.format('; '.join(parts)))


def _reader(files, r):
    readers = sorted(q for q, m in files.get(r, ()) if isinstance(m, dict))
    if not readers:
        return None
    return r if r in readers else readers[0]


def _wanted(comm, name, part_old, mine):
    """Return the parameter paths whose state this rank keeps (every one, unless this job is sharded)."""
    if mine.get(name) is None:
        return set(part_old['owners'])
    return set(owned_paths(mine[name], comm.rank))


def _param_shapes(opt):
    """Return ``{parameter path: shape}`` of ``opt``'s target (initialized parameters only)."""
    return {path.strip('/'): tuple(param.array.shape) for path, param in opt.target.namedparams()
            if param.array is not None}


def _pack(values):
    buf = io.BytesIO()
    npz.write(buf, dict(values))
    return numpy.frombuffer(buf.getvalue(), dtype=numpy.uint8)


def gather(ckpt, obj, it, files, rec, values, allowed):
    """Put into ``values`` the share of every old rank this job needs; return None or why not (collective).

    Every rank calls it with the same ``files`` and ``rec``.  For each old rank, the rank that
    reads its file (``_reader``) sends the keys under the optimizer prefix of the parameters that
    rank owned; every rank keeps those of :func:`_wanted`.
    """
    comm = ckpt.comm
    mine = job_partitions(obj, comm)
    prefixes = _state_prefixes(obj, rec)
    size = max(p['world_size'] for p in rec.values())
    for r in range(size):
        q = _reader(files, r)
        if q is None:   # screened before; every rank sees the same
            return describe_missing(ckpt, it, [(r, [])])
        roots = {name: tuple('{}{}/'.format(prefixes[name], p) for p in owned_paths(rec[name], r))
                 for name in prefixes}
        problem, data = None, None
        if comm.rank == q:
            fn = ckpt.filename(it, r)
            try:
                with safe_files.open_trusted(fn, 'snapshot', allow_shared=ckpt.allow_shared) as f:
                    got, _ = npz.read(f, allow_pickle=allowed, name=fn,
                                      limits=_share_limits(obj, prefixes, rec, r),
                                      keep=tuple(prefixes.values()))
                share = {k: v for k, v in got.items()
                         if any(k.startswith(ro) for ro in roots.values() if ro)}
                missing = _lacking(share, obj, prefixes, rec, r)
                if missing:
                    problem = 'lacks the state of parameter(s) it owned: {}'.format(
                        ', '.join(missing[:6]))
                else:
                    data = _pack(share)   # plain arrays only: what travels is read without pickle
            except Exception as e:   # unreadable, refused, too large: this share is not available
                problem = '{}: {}'.format(type(e).__name__, e)
        problem = comm.bcast_obj(problem, root=q)
        if problem is not None:
            return ('its share file {} (read by rank {}) cannot be used: {}; without it the '
                    'optimizer state of the parameters rank {} owned is lost'.format(
                        ckpt.filename(it, r), q, problem, r))
        buf = comm.bcast(data, root=q)
        got, _ = npz.read(io.BytesIO(buf.tobytes()), allow_pickle=False,
                          limits=_share_limits(obj, prefixes, rec, r), name=ckpt.filename(it, r))
        npz.split_meta(got)
        for name, pre in prefixes.items():
            keep = _wanted(comm, name, rec[name], mine)
            for path in owned_paths(rec[name], r):
                root = '{}{}/'.format(pre, path)
                for k, v in got.items():
                    if k.startswith(root) and (path in keep or k == root + 't'):
                        values[k] = v
    return None


def _share_limits(obj, prefixes, rec, r):
    """Return ``{key: most bytes}`` of the state keys of old rank ``r``'s share (parameter-shaped)."""
    out = {}
    for name, pre in prefixes.items():
        opt = lineage.optimizers_of(obj)[name][1]
        shapes = _param_shapes(opt)
        names = lineage.state_keys(opt) or []
        for path in owned_paths(rec[name], r):
            shape = shapes.get(path)
            if shape is None:
                continue
            out['{}{}/t'.format(pre, path)] = npz.member_limit(())
            for s in names:
                out['{}{}/{}'.format(pre, path, s)] = npz.member_limit(shape)
    return out


def _lacking(share, obj, prefixes, rec, r):
    """Return the state keys of old rank ``r``'s parameters its file lacks (its optimizer's state names)."""
    out = []
    for name, pre in prefixes.items():
        names = lineage.state_keys(lineage.optimizers_of(obj)[name][1]) or []
        for path in owned_paths(rec[name], r):
            for s in names:
                key = '{}{}/{}'.format(pre, path, s)
                if key not in share:
                    out.append(key)
    return out
