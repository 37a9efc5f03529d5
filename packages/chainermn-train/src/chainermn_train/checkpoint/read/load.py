"""Loading: the ranks agree on the newest usable generation and load it (or reshard it).

Collective throughout.  On the same world size every rank loads its own file of the newest
iteration all ranks can read (bitwise resume).  Otherwise every rank loads the shared state of one
readable file of the newest usable generation, sent by a rank that can read it, and the updater's
iterators move to the same epoch and fraction of their new shard (see ``reshard.resize``).  A
generation of sharded optimizer state that this job partitions otherwise (another world size, or an
unsharded optimizer) also gets every old rank's share (``reshard.state_shares``); one whose shares
cannot all be read is refused, naming the files, and the next older generation is tried.
"""

import io
import time

import chainer
import numpy
from chainermn_comm import safe_files, voice
from chainermn_comm.log import get_logger

from chainermn_train.checkpoint.ownership import trust
from chainermn_train.checkpoint.read import data_order, generations, lineage, npz
from chainermn_train.checkpoint.reshard import resize, state_shares
from chainermn_train.checkpoint.write import complete

__all__ = ['load', 'read_own']

_log = get_logger('train')


def _read_file(ckpt, fn, allow_pickle, limits, keep):
    with safe_files.open_trusted(fn, 'snapshot', allow_shared=ckpt.allow_shared) as f:
        return npz.read(f, allow_pickle=allow_pickle, limits=limits, name=fn, keep=keep)


def read_own(ckpt, iteration, allow_pickle, how, expected=None, source=None, keep=None,
             limits=None):
    """Return ``(values, None)``, or ``(None, (kind, why))`` when this rank cannot use its file.

    ``kind`` is ``'refused'`` (it needs pickle, not allowed) or ``'unreadable'`` (missing,
    truncated, corrupt, not a snapshot, larger than the arrays it fills, not trusted, or lacking a
    key of ``expected``).  ``source`` (bytes) replaces reading the file.  Metadata keys are removed from
    ``values``.  Every member is bounded by the shape ``expected`` (or ``limits``, when given)
    gives its key; ``keep`` (key prefixes) leaves the other members unread.
    """
    fn = ckpt.filename(iteration)
    limits = resize.byte_limits(expected) if limits is None else limits
    try:
        if source is None:
            values, pickled = _read_file(ckpt, fn, allow_pickle, limits, keep)
        else:
            values, pickled = npz.read(io.BytesIO(source), allow_pickle=allow_pickle,
                                       limits=limits, name=fn, keep=keep)
    except npz.PickleRequired as e:
        return None, ('refused', str(e))
    except Exception as e:  # truncated, corrupt, missing: all mean "cannot use this one"
        return None, ('unreadable', '{}: {}'.format(type(e).__name__, e))
    if pickled:
        trust.warn_pickle_once(ckpt.comm.rank, fn, pickled, how)
    npz.split_meta(values)
    problem = resize.mismatches(expected, values)
    if problem is not None:
        return None, ('unreadable', 'a valid snapshot file that ' + problem)
    return values, None


def agree_on_generation(ckpt, candidates, allow_pickle, how, expected=None, rejected=None,
                        keep=None):
    """Return ``(iteration, values, refused)`` for the newest candidate every rank can read.

    Collective.  Candidates are tried newest first; each rank reads its own file and the ranks
    exchange what went wrong.  ``refused`` lists ``(rank, why)`` of the files refused for
    needing pickle on the way; iteration and values are None when no candidate works.
    ``expected`` may be a function of the iteration (what a generation's file must hold).
    """
    refused = []
    for it in sorted(candidates, reverse=True):
        values, problem = read_own(ckpt, it, allow_pickle, how, _expected_at(expected, it), keep=keep)
        # Only short status tuples are exchanged, between the ranks of this job (MPI).
        problems = ckpt.comm.allgather_obj(problem)
        bad = [(r, p[0], p[1]) for r, p in enumerate(problems) if p is not None]
        if not bad:
            return it, values, refused
        if rejected is not None:
            rejected.setdefault(it, []).extend(
                'rank {} {}: {}'.format(r, ckpt.filename(it, r), why) for r, _, why in bad)
        ckpt._stats['skipped_unreadable'] += 1
        refused_here = [(r, why) for r, kind, why in bad if kind == 'refused']
        if refused_here:
            ckpt._stats['refused_pickle'] += 1
            refused += refused_here
        # The same text on every rank (all saw ``problems``): every rank warns, rank 0 shows it.
        voice.warn_all(
            'cannot use the snapshots of iteration {} ({}); falling back to an older common '
            'iteration{}'.format(
                it, '; '.join('rank {} {}: {}'.format(r, ckpt.filename(it, r),
                                                      'refused: ' + why if kind == 'refused' else why)
                              for r, kind, why in bad),
                ' ({})'.format(trust.OPT_IN_HINT) if refused_here else ''),
            trust.CheckpointWarning, ckpt.comm.rank, stacklevel=4)
    return None, None, refused


def _expected_at(expected, it):
    return expected(it) if callable(expected) else expected


def _donors(ckpt, it, files, rejected, refused):
    """Return ``(rank, reader, meta)`` of the files of generation ``it`` that some rank can read."""
    donors = []
    for r in sorted(files):
        seen = list(files[r])
        metas = [m for _, m in seen if isinstance(m, dict)]
        if not metas:
            rejected.setdefault(it, []).append('rank {} {}: {}'.format(
                r, ckpt.filename(it, r), seen[0][1][1]))
            if seen[0][1][0] == 'refused':
                refused.append((r, seen[0][1][1]))
            continue
        if 'world_size' not in metas[0]:
            rejected.setdefault(it, []).append(
                'rank {} {}: written without generation metadata (by an older chainermn), so it '
                'can only resume a job of the world size that wrote it, with every rank\'s own '
                'file'.format(r, ckpt.filename(it, r)))
            continue
        readers = [q for q, m in seen if isinstance(m, dict)]
        donors.append((r, r if r in readers else readers[0], metas[0]))
    return donors


def reshard(ckpt, trainer, gens, allowed, how, expected, rejected, local, weights_only=False,
            keep=None):
    """Load the shared state of one readable file of the newest usable generation on every rank.

    Collective.  Returns ``(iteration, values, refused, mode)``; iteration is None if none works.
    ``expected`` may be a function of the iteration.
    """
    rank = ckpt.comm.rank
    refused = []
    expected_of = expected
    for it in sorted(gens, reverse=True):
        expected = _expected_at(expected_of, it)
        donors = _donors(ckpt, it, gens[it], rejected, refused)
        for r, q, meta in donors:
            problem, data = None, None
            if rank == q:
                fn = ckpt.filename(it, r)
                try:
                    with safe_files.open_trusted(fn, 'snapshot', allow_shared=ckpt.allow_shared) as f:
                        npz.read(f, allow_pickle=allowed, limits=resize.byte_limits(expected),
                                 name=fn, keep=keep)   # bounded: checked before its bytes travel
                        f.seek(0)
                        data = f.read()
                except npz.PickleRequired as e:
                    problem = ('refused', str(e))
                except Exception as e:
                    problem = ('unreadable', '{}: {}'.format(type(e).__name__, e))
            problem = ckpt.comm.bcast_obj(problem, root=q)
            if problem is not None:
                rejected.setdefault(it, []).append('rank {} {}: {}'.format(
                    r, ckpt.filename(it, r), problem[1]))
                if problem[0] == 'refused':
                    refused.append((r, problem[1]))
                continue
            buf = ckpt.comm.bcast(numpy.frombuffer(data, dtype=numpy.uint8) if rank == q else None,
                                  root=q)
            values, mine = read_own(ckpt, it, allowed, how, source=buf.tobytes(), keep=keep,
                                    limits=resize.byte_limits(expected))
            if mine is None and not weights_only:
                resize.fill_local(values, local)   # e.g. rank 0's LogReport from another rank's file
                try:
                    resize.rebuild_iterator_values(trainer, values, meta, rank)
                except Exception as e:
                    mine = ('unreadable', '{}: {}'.format(type(e).__name__, e))
            if mine is None:
                problem = resize.mismatches(expected, values)
                if problem is not None:
                    mine = ('mismatch', problem)
            problems = ckpt.comm.allgather_obj(mine)
            by_reason = {}
            for k, p in enumerate(problems):
                if p is not None:
                    by_reason.setdefault(p[1], []).append(str(k))
            if by_reason:
                rejected.setdefault(it, []).append('{} (world size {}) sent by rank {}: {}'.format(
                    ckpt.filename(it, r), meta['world_size'], q, '; '.join(
                        'rank(s) {}: {}'.format(','.join(ks), why) for why, ks in by_reason.items())))
                if any(p is not None and p[0] == 'mismatch' for p in problems):
                    break   # every file of a generation holds the same shared state
                continue
            resize.average_rank_state(   # e.g. PowerSGD's error memories: their mean on every rank
                ckpt.comm, [(d[0], d[1]) for d in donors], values,
                lambda old: _read_checked(ckpt, ckpt.filename(it, old), allowed, expected))
            mode = 'resharded from {} (world size {}, {} rank(s) per node)'.format(
                ckpt.filename(it, r), meta['world_size'], meta.get('ranks_per_node', '?'))
            return it, values, refused, mode
    return None, None, refused, None


def _read_checked(ckpt, fn, allowed, expected):
    """Return the values of the snapshot ``fn`` read as every snapshot is: trusted, bounded."""
    with safe_files.open_trusted(fn, 'snapshot', allow_shared=ckpt.allow_shared) as f:
        return npz.read(f, allow_pickle=allowed, limits=resize.byte_limits(expected), name=fn)[0]


def _unusable(ckpt, gens, rejected, refused, fresh_ok):
    """Return None (start fresh) or raise the error that says why no generation can be used."""
    rank, size = ckpt.comm.rank, ckpt.comm.size
    text = generations.summary(gens, rejected)
    if fresh_ok:
        voice.warn_all('no snapshot generation of {!r} in {} can be used; starting from '
                       'iteration 0 as asked (start_fresh). {}'.format(ckpt.name, ckpt.path, text),
                       trust.CheckpointWarning, rank, stacklevel=4)
        return None
    if refused:
        raise trust.UnsafeCheckpointError(
            'rank {}: no generation of the snapshots {!r} in {} can be used and some were '
            'refused because loading them needs pickle; nothing was loaded. Refused: {}. '
            'To load them anyway: {}. {}'.format(
                rank, ckpt.name, ckpt.path,
                '; '.join('rank {}: {}'.format(r, why) for r, why in refused), trust.OPT_IN_HINT,
                text))
    raise trust.SnapshotUnusableError(
        'rank {}: snapshots {!r} exist in {} but no generation can be used by this job of {} '
        'rank(s); nothing was loaded and nothing was deleted. {} Fix or remove the files, or '
        'pass maybe_load(..., start_fresh=True) (or {}=1) to start from iteration 0.'.format(
            rank, ckpt.name, ckpt.path, size, text, trust.START_FRESH_ENV))


def _refuse_untrusted(views):
    """Raise UntrustedPathError (the same on every rank: all see ``views``) for links and others' files."""
    bad = [(q, m[1]) for q, view in enumerate(views) for _, m in sorted(view.items())
           if isinstance(m, tuple) and m[0] == 'untrusted']
    if bad:
        more = ' ({} more such file(s))'.format(len(bad) - 1) if len(bad) > 1 else ''
        raise safe_files.UntrustedPathError('rank {}: {}{}; nothing was loaded.'.format(
            bad[0][0], bad[0][1], more))


def _weights_only(trainer, expected):
    """Return ``expected`` cut down to the models' keys, and ``[(prefix, model)]`` to load them into."""
    models = lineage.models_of(trainer)
    if models is None:
        return expected, None
    prefixes = tuple(p for p, _ in models)
    return {k: v for k, v in expected.items() if k.startswith(prefixes)}, models


def _deserialize(trainer, values, models, rank, it):
    try:
        if models is None:
            chainer.serializers.NpzDeserializer(values).load(trainer)
        else:
            for prefix, model in models:
                chainer.serializers.NpzDeserializer(values, path=prefix).load(model)
    except KeyError as e:
        raise trust.SnapshotUnusableError(
            'rank {}: the snapshot of iteration {} lacks key {} that this job needs while loading; '
            'the job is not the one that wrote it'.format(rank, it, e)) from None


def _remove_incomplete(ckpt, gens, incomplete):
    """Remove this rank's files of the incomplete generations of the run it resumes (local)."""
    for it in incomplete:
        for _, m in gens[it].get(ckpt.comm.rank, ()):
            if isinstance(m, dict) and lineage.run_of(m) == ckpt.run_id:
                ckpt._remove(ckpt.filename(it))
                break


def _load_and_gather(ckpt, trainer, usable, allowed, how, expected, rejected, local, weights_only,
                     keep):
    """Return ``(iteration, values, refused, mode)`` of the newest usable generation (collective).

    Each rank's own file on the same world size, else one file's shared state (``reshard``); a
    generation of sharded optimizer state that this job partitions otherwise also gets every old
    rank's share (``reshard.state_shares``), or is refused and the next older one is tried.
    """
    size = ckpt.comm.size
    gather_at = {}
    if not weights_only:
        mine = state_shares.job_partitions(trainer, ckpt.comm)
        for it in sorted(usable):
            rec = state_shares.recorded(usable[it])
            if rec and state_shares.needs_gather(rec, mine):
                gather_at[it] = rec
        for it in sorted(gather_at):   # every rank sees the same files: the same decision
            missing = state_shares.missing_files(usable[it], gather_at[it])
            if missing:
                rejected.setdefault(it, []).append(state_shares.describe_missing(ckpt, it, missing))
                del usable[it]
    usable = dict(usable)

    def expected_at(it):
        if it in gather_at:
            return state_shares.without_state(expected, trainer, gather_at[it])
        return expected

    refused = []
    exact_all = [it for it in generations.exact_candidates(usable, size)
                 if not generations.own_file_problems(usable[it], size, rejected.setdefault(it, []))]
    while True:
        exact = [it for it in exact_all if it in usable]
        it, values, refused1 = agree_on_generation(ckpt, exact, allowed, how, expected_at, rejected,
                                                   keep)
        refused += refused1
        mode = 'same world size, own files'
        if it is None:
            it, values, refused2, mode = reshard(ckpt, trainer, usable, allowed, how, expected_at,
                                                 rejected, local, weights_only, keep)
            refused += refused2
        if it is None or it not in gather_at:
            return it, values, refused, mode
        why = state_shares.gather(ckpt, trainer, it, usable[it], gather_at[it], values, allowed)
        if why is None:
            problems = ckpt.comm.allgather_obj(resize.mismatches(expected, values))
            bad = ['rank {}: {}'.format(r, p) for r, p in enumerate(problems) if p is not None]
            if bad:
                why = 'with the shares of its sharded optimizer state gathered, the state ' + '; '.join(bad)
        if why is None:
            old = max(p['world_size'] for p in gather_at[it].values())
            return it, values, refused, mode + ', sharded optimizer state gathered from {} file(s)'.format(old)
        rejected.setdefault(it, []).append(why)
        voice.warn_all('cannot use the snapshots of iteration {} of {!r}: {}; falling back to an '
                       'older generation'.format(it, ckpt.name, why),
                       trust.CheckpointWarning, ckpt.comm.rank, stacklevel=4)
        del usable[it]


def load(ckpt, trainer, optimizer, allow_pickle, start_fresh, weights_only=False):
    """Do the work of ``MultiNodeCheckpointer.maybe_load``; return the loaded iteration or None."""
    start = time.monotonic()
    allowed, how = trust.allow_pickle(allow_pickle if allow_pickle is not None else ckpt.allow_pickle)
    fresh_ok = trust.start_fresh(start_fresh)
    ckpt._prepare_load()
    local = {}
    expected = resize.expected_keys(trainer, local)
    models = None
    if weights_only:
        expected, models = _weights_only(trainer, expected)
    views = ckpt.comm.allgather_obj((ckpt._scan(), complete.read_records(ckpt.path, ckpt.name,
                                                                         ckpt.allow_shared)))
    committed = set().union(*(c for _, c in views))
    views = [v for v, _ in views]
    _refuse_untrusted(views)
    gens = generations.group_views(views)
    size, rank = ckpt.comm.size, ckpt.comm.rank
    rejected = {}
    # Every rank sees the same views, so every rank screens out the same generations.
    skip = lineage.screen(gens, trainer, weights_only, rejected)
    skip |= {it for it, _ in generations.oversized(gens, rejected)}
    incomplete = complete.incomplete(gens, committed)
    for it, why in incomplete.items():
        rejected.setdefault(it, []).append(why)
    skip |= set(incomplete)
    usable = {it: files for it, files in gens.items() if it not in skip}
    keep = tuple(p for p, _ in models) if models else None   # weights only: the rest stays unread
    it, values, refused, mode = _load_and_gather(ckpt, trainer, usable, allowed, how, expected,
                                                 rejected, local, weights_only, keep)
    st = ckpt._stats
    if it is None:
        st['load_seconds'] += time.monotonic() - start
        if not gens:
            return None
        if set(gens) <= set(incomplete) and not weights_only:
            # Only generations a killed run never completed (background writes): none was ever
            # loadable, so this run starts from iteration 0 as that run's continuation and
            # removes its own files of them.
            runs = {lineage.run_of(m) for g in gens for fl in gens[g].values() for _, m in fl
                    if isinstance(m, dict)}
            if len(runs) == 1 and None not in runs:
                ckpt.run_id = runs.pop()
                _remove_incomplete(ckpt, gens, incomplete)
            if rank == 0:
                _log.info('chainermn checkpoint: no complete generation of %r; starting from '
                          'iteration 0 (%s)', ckpt.name, generations.summary(gens, rejected))
            return None
        return _unusable(ckpt, gens, rejected, refused, fresh_ok)
    _deserialize(trainer, values, models if weights_only else None, rank, it)
    skipped = sorted((g for g in gens if g > it and rejected.get(g)), reverse=True)
    if skipped:
        voice.warn_all('loading generation {} of {!r}; newer ones were refused: {}'.format(
            it, ckpt.name, ' | '.join('iteration {}: {}'.format(g, '; '.join(rejected[g]))
                                      for g in skipped)), trust.CheckpointWarning, rank, stacklevel=4)
    runs = {lineage.run_of(m) for fl in gens[it].values() for _, m in fl if isinstance(m, dict)}
    if not weights_only:
        data_order.check(gens[it], rank, ckpt.name)   # every rank sees the same metadata
        if optimizer is not None and hasattr(optimizer, '_mn_mark_synced'):
            optimizer._mn_mark_synced()
        ckpt._counter = it
        if len(runs) == 1 and None not in runs:
            ckpt.run_id = runs.pop()   # this job continues the run it resumed
        mode += ', run {}'.format(ckpt.run_id)
        _remove_incomplete(ckpt, gens, incomplete)
        ckpt._committed = {i for run, i in committed if run == ckpt.run_id}
    else:
        mode += ', model weights only'
    st['loads'] += 1
    st['loaded_iteration'] = it
    st['load_mode'] = mode
    st['load_seconds'] += time.monotonic() - start
    if rank == 0:
        _log.info('chainermn checkpoint: loaded generation %d of %r (%s; %d rank(s) now)',
                  it, ckpt.name, mode, size)
    return it
