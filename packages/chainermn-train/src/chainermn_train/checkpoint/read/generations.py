"""Generations of snapshot files: which exist, which are complete, which are old enough to remove.

A generation is the set of files ``<name>.<rank>.<iteration>`` of one iteration (rank and iteration
in ASCII digits, without leading zeros; other names that start with ``<name>.`` are stray and left
alone).  Every function here is local to the calling rank (no communication); agreeing across
ranks is ``load``.
"""

import os
import re

import numpy

from chainermn_comm import safe_files

from chainermn_train.checkpoint.read import lineage, npz

__all__ = ['list_files', 'read_meta', 'remember_meta', 'BYTES_KEY', 'group_views', 'exact_candidates',
           'own_file_problems', 'complete_generation_exists', 'oversized', 'files_to_collect',
           'summary']

_NUMBER = re.compile(r'^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)$')
#: Key of the metadata dict under which :func:`read_meta` adds the bytes the file's entries declare.
BYTES_KEY = ' declared bytes'
#: A file is refused when it declares more than this many times the median of its generation ...
_FAR_LARGER = 4
#: ... plus this many bytes (rank 0 may hold a bigger log than the others).
_SLACK_BYTES = 16 << 20
#: The metadata of files read (or written) by this process, while the file is what it was:
#: ``{path: (identity, allow_shared, meta)}`` (see :func:`_identity`).
_KNOWN = {}
_KNOWN_MOST = 4096


def list_files(directory, name, stray=None):
    """Return the sorted ``(rank, iteration)`` of every snapshot file of ``name`` in ``directory``.

    Names that start with ``<name>.`` but are not ``<name>.<rank>.<iteration>`` in ASCII digits
    are left out and, when ``stray`` (a list) is given, appended to it.
    """
    prefix = name + '.'
    out = []
    try:
        entries = os.listdir(directory)
    except FileNotFoundError:
        return out
    for fn in entries:
        if fn.startswith(prefix):
            m = _NUMBER.match(fn[len(prefix):])
            if m:
                out.append((int(m.group(1)), int(m.group(2))))
            elif stray is not None:
                stray.append(fn)
    return sorted(out)


def _identity(path):
    """Return what changes whenever the file at ``path`` is changed, replaced, chmod-ed or chown-ed."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode, st.st_uid)


def remember_meta(path, meta, size):
    """Record the metadata of the snapshot file this process just wrote at ``path`` (``size`` bytes).

    ``meta`` as it was written (numbers); :func:`read_meta` then answers without reading the file
    while it stays as it is.
    """
    known = {key: numpy.asarray(value).item() if numpy.ndim(value) == 0 else numpy.asarray(value)
             for key, value in meta.items()}
    known[BYTES_KEY] = size
    _keep(path, _identity(path), None, known)


def _keep(path, identity, allow_shared, meta):
    if identity is None:
        return
    if len(_KNOWN) >= _KNOWN_MOST:
        _KNOWN.clear()
    _KNOWN[path] = (identity, allow_shared, meta)


def read_meta(path, allow_shared=None, rank=None, iteration=None):
    """Return the metadata of the snapshot file ``path``, or ``(kind, why)`` when it cannot be used.

    The file is opened only if it is a regular file this user may trust
    (``safe_files.open_trusted``; else kind ``'untrusted'``).  ``rank`` and ``iteration``, when
    given, must equal what the file records (kind ``'mismatch'`` for a renamed or planted file).  The
    dict also holds, under :data:`BYTES_KEY`, the bytes its zip entries declare in all.  A file
    read (or written, :func:`remember_meta`) before by this process and not changed since (same
    inode, size, times, mode and owner) is not read again: parsing a zip's directory is Python
    work that a background writer thread would take from training.
    """
    identity = _identity(path)
    known = _KNOWN.get(path)
    if (identity is not None and known is not None and known[0] == identity
            and known[1] in (None, allow_shared)):
        meta = dict(known[2])
    else:
        meta = _read_meta(path, allow_shared)
        if not isinstance(meta, dict):
            return meta
        _keep(path, identity, allow_shared, dict(meta))
    for key, want in (('iteration', iteration), ('rank', rank)):
        have = meta.get(key)
        if want is not None and have is not None and int(have) != int(want):
            return ('mismatch', 'it records {} {} but its name says {} (renamed, or put there '
                    'by someone else)'.format(key, have, want))
    return meta


def _read_meta(path, allow_shared):
    try:
        with safe_files.open_trusted(path, 'snapshot', allow_shared=allow_shared) as f:
            meta = npz.read_meta(f, name=path)
            f.seek(0)
            meta[BYTES_KEY] = max(npz.declared_bytes(f), os.fstat(f.fileno()).st_size)
    except safe_files.UntrustedPathError as e:
        return ('untrusted', str(e))
    except npz.PickleRequired as e:
        return ('refused', str(e))
    except Exception as e:
        return ('unreadable', '{}: {}'.format(type(e).__name__, e))
    return meta


def _world_size_of(meta):
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


def own_file_problems(files, size, reasons):
    """Return whether a rank's own file of a generation (``{rank: [(seen_by, meta)]}``) contradicts its name.

    Such a file rules out the bitwise resume from this generation (other read problems are found,
    and warned about, when the ranks read their files); each reason is appended to ``reasons``.
    """
    bad = False
    for k in range(size):
        for q, m in files.get(k, ()):
            if q == k and isinstance(m, tuple) and m[0] == 'mismatch':
                reasons.append('rank {}: {}'.format(k, m[1]))
                bad = True
    return bad


def oversized(gens, rejected):
    """Return ``{(iteration, rank)}`` of files that declare far more bytes than their generation's others.

    Such a file (a compression bomb, or not a snapshot of this run) is refused before any of its
    data is inflated; why is added to ``rejected``.
    """
    out = set()
    for it, files in gens.items():
        sizes = {}
        for r, seen in files.items():
            for _, m in seen:
                if isinstance(m, dict) and BYTES_KEY in m:
                    sizes[r] = m[BYTES_KEY]
        if len(sizes) < 2:
            continue
        for r, n in sizes.items():
            others = sorted(v for k, v in sizes.items() if k != r)
            median = others[len(others) // 2]
            if n > _FAR_LARGER * median + _SLACK_BYTES:
                out.add((it, r))
                rejected.setdefault(it, []).append(
                    'rank {}\'s file declares {} bytes, far more than the {} bytes of the other '
                    'files of its generation; refused before inflating it'.format(r, n, median))
    return out


def complete_generation_exists(files, size, meta_of):
    """Return whether every rank of world size ``size`` has a file of one iteration written at it."""
    by_it = {}
    for r, it in files:
        by_it.setdefault(it, set()).add(r)
    for it, ranks in by_it.items():
        if all(r in ranks for r in range(size)) and all(
                _world_size_of(meta_of(it, r)) == size for r in range(size)):
            return True
    return False


def _own_lineage(meta, run):
    # A file of this run, or one written before runs were recorded; never another run's file.
    return isinstance(meta, dict) and lineage.run_of(meta) in (None, run)


def files_to_collect(files, rank, size, keep, meta_of, run, floor=None):
    """Return the ``(rank, iteration)`` this rank's garbage collection removes (keeping the newest ``keep``).

    ``floor`` (when given): only files older than this iteration, the newest known complete, are
    removed, so that a crash before a newer generation is complete still finds one.

    Only files of the run ``run`` (or written before runs were recorded) are ever removed, never
    another run's.  Files written by a job of another world size (and, on rank 0, files of ranks
    that this job does not have) are removed only once a complete generation of the current size
    is on disk.
    """
    mine = [(rank, it) for r, it in files if r == rank and _own_lineage(meta_of(it, rank), run)]
    current = [it for _, it in mine if _world_size_of(meta_of(it, rank)) == size]
    older = [(r, it) for r, it in mine if it not in current]
    if rank == 0:
        older += [(r, it) for r, it in files if r >= size and _own_lineage(meta_of(it, r), run)]
    out = []
    if older and complete_generation_exists(files, size, meta_of):
        out += older
    out += [(rank, it) for it in current[:-keep] if floor is None or it < floor]
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
