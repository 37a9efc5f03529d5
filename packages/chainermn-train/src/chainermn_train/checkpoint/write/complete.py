"""Which generations are complete: every rank's file of it is durable, and the loader can tell.

A file reaches its final name only once it is ``fsync``-ed (``writer``), so a generation is
complete when every rank's file of it has its final name.  A generation written in the background
(its files record ``background``) may be caught half-written by a crash, so the loader takes it
only when it is complete: either every rank of the world size that wrote it has its file on disk
(seen by some rank), or the ranks agreed that every rank's write of it finished and recorded
that, each in its own record ``.<name>.<rank>.complete`` (the newest complete generations of its
run, written through ``chainermn_comm.safe_files``) -- the record lets a generation whose files
on a lost node-local disk are gone still reshard.  Generations written synchronously keep the
rules they always had.  Every function here is local (no communication).
"""

import json
import os
import re

from chainermn_comm import safe_files

from chainermn_train.checkpoint.read import lineage

__all__ = ['BACKGROUND_KEY', 'record_path', 'read_records', 'write_record', 'remove_record',
           'incomplete']

#: Metadata key: 1 in a file written in the background.
BACKGROUND_KEY = 'background'
_LIMIT = 1 << 16
_KEPT = 64   # most iterations a record lists


def record_path(directory, name, rank):
    """Return the path of rank ``rank``'s record of the complete generations of snapshots ``name``."""
    return os.path.join(directory, '.{}.{}.complete'.format(name, int(rank)))


def read_records(directory, name, allow_shared=None):
    """Return ``{(run, iteration)}`` that the records in ``directory`` say are complete.

    Records that are not this user's regular files, or not readable, are ignored.
    """
    pattern = re.compile(r'^\.{}\.(0|[1-9][0-9]*)\.complete$'.format(re.escape(name)))
    out = set()
    try:
        entries = os.listdir(directory)
    except OSError:
        return out
    for fn in entries:
        if not pattern.match(fn):
            continue
        try:
            with safe_files.open_trusted(os.path.join(directory, fn), 'complete-generation record',
                                         allow_shared=allow_shared) as f:
                rec = json.loads(f.read(_LIMIT).decode('utf-8'))
            run = str(rec['run'])
            out.update((run, int(it)) for it in rec['iterations'])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def write_record(directory, name, rank, run, iterations):
    """Replace this rank's record with ``iterations`` (the newest :data:`_KEPT`) of run ``run``."""
    its = sorted(int(i) for i in iterations)[-_KEPT:]
    safe_files.write_text(record_path(directory, name, rank),
                          json.dumps({'run': run, 'iterations': its}))


def remove_record(directory, name, rank):
    """Remove this rank's record (when it is this user's regular file)."""
    safe_files.remove_own(record_path(directory, name, rank))


def incomplete(gens, committed):
    """Return ``{iteration: why}`` of the generations written in the background that are not complete.

    ``gens`` is ``{iteration: {rank: [(seen_by, meta), ...]}}`` (``read.generations.group_views``),
    ``committed`` the ``{(run, iteration)}`` of :func:`read_records`.
    """
    out = {}
    for it, files in gens.items():
        metas = [m for seen in files.values() for _, m in seen if isinstance(m, dict)]
        if not any(int(m.get(BACKGROUND_KEY, 0) or 0) for m in metas):
            continue
        size = next((m['world_size'] for m in metas if m.get('world_size') is not None), None)
        if size is None:
            continue
        runs = {lineage.run_of(m) for m in metas}
        if any((run, it) in committed for run in runs):
            continue
        have = {r for r, seen in files.items() if any(isinstance(m, dict) for _, m in seen)}
        missing = [r for r in range(int(size)) if r not in have]
        if missing:
            out[it] = ('incomplete: written in the background and the file(s) of rank(s) {} never '
                       'reached the disk (a rank stopped during the write, or its save failed); '
                       'never loaded'.format(','.join(str(r) for r in missing)))
    return out
