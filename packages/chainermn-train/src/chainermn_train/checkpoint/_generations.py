"""Generations of snapshot files: which exist, which are complete, which are old enough to remove.

A generation is the set of files ``<name>.<rank>.<iteration>`` of one iteration.  Every function
here is local to the calling rank (no communication); agreeing across ranks is ``_load``.
"""

import os

from chainermn_train.checkpoint import _safe_npz

__all__ = ['list_files', 'read_meta', 'group_views', 'exact_candidates', 'complete_generation_exists',
           'files_to_collect', 'summary']


def list_files(directory, name):
    """Return the sorted ``(rank, iteration)`` of every snapshot file of ``name`` in ``directory``."""
    prefix = name + '.'
    out = []
    try:
        entries = os.listdir(directory)
    except FileNotFoundError:
        return out
    for fn in entries:
        if fn.startswith(prefix):
            parts = fn[len(prefix):].split('.')
            if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
                out.append((int(parts[0]), int(parts[1])))
    return sorted(out)


def read_meta(path):
    """Return the metadata of the snapshot file ``path``, or ``(kind, why)`` when it cannot be read."""
    try:
        return _safe_npz.read_meta(path)
    except _safe_npz.PickleRequired as e:
        return ('refused', str(e))
    except Exception as e:
        return ('unreadable', '{}: {}'.format(type(e).__name__, e))


def world_size_of(path):
    """Return the world size that wrote ``path`` (None if unknown or unreadable)."""
    meta = read_meta(path)
    return meta.get('world_size') if isinstance(meta, dict) else None


def group_views(views):
    """Return ``{iteration: {rank: [(seen_by, meta), ...]}}`` from every rank's ``{(it, r): meta}``."""
    gens = {}
    for q, view in enumerate(views):
        for (it, r), meta in view.items():
            gens.setdefault(it, {}).setdefault(r, []).append((q, meta))
    return gens


def exact_candidates(gens, size):
    """Return the iterations whose file of every rank < ``size`` is seen by that rank, at this size."""
    return [it for it, files in gens.items() if all(
        any(q == k and (not isinstance(m, dict) or m.get('world_size', size) == size)
            for q, m in files.get(k, ())) for k in range(size))]


def complete_generation_exists(files, size, filename):
    """Return whether every rank of world size ``size`` has a file of one iteration written at it."""
    by_it = {}
    for r, it in files:
        by_it.setdefault(it, set()).add(r)
    for it, ranks in by_it.items():
        if all(r in ranks for r in range(size)) and all(
                world_size_of(filename(it, r)) == size for r in range(size)):
            return True
    return False


def files_to_collect(files, rank, size, keep, filename):
    """Return the paths this rank's garbage collection removes (keeping the newest ``keep``).

    Files written by a job of another world size (and, on rank 0, files of ranks that this job
    does not have) are removed only once a complete generation of the current size is on disk.
    """
    its = [it for r, it in files if r == rank]
    current = [it for it in its if world_size_of(filename(it, rank)) == size]
    older = [(rank, it) for it in its if it not in current]
    if rank == 0:
        older += [(r, it) for r, it in files if r >= size]
    out = []
    if older and complete_generation_exists(files, size, filename):
        out += [filename(it, r) for r, it in older]
    out += [filename(it, rank) for it in current[:-keep]]
    return out


def summary(gens, rejected):
    """Describe every generation found: who wrote it, the world size it needs, why it was rejected."""
    parts = []
    for it in sorted(gens, reverse=True):
        files = gens[it]
        sizes = sorted({m.get('world_size') for fl in files.values() for _, m in fl
                        if isinstance(m, dict) and m.get('world_size') is not None})
        need = ('world size {}'.format('/'.join(str(x) for x in sizes)) if sizes
                else 'world size unknown (written without generation metadata)')
        why = rejected.get(it) or ['no rank can read a complete snapshot file of it']
        parts.append('iteration {} (files of rank(s) {}; written by a job of {}): {}'.format(
            it, ','.join(str(r) for r in sorted(files)), need, '; '.join(why)))
    return 'Generations found: ' + ' | '.join(parts) + '.'
