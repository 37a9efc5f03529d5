"""Trace files: one part per rank, and their merge into ``trace.json`` (Chrome Trace Event Format).

Every file is written through :mod:`chainermn_comm.safe_files` (a new file under an unpredictable
name, renamed into place), so a reader never sees half a file and a name planted by someone else
is never followed.  Merges run under an ``fcntl`` lock on ``DIR/.trace.lock`` (made exclusively,
never through a link): the rank that finds every part of its run present merges them.  Parts
carry the run they belong to (``run``: chosen by rank 0 at start), so parts left in the
directory by an earlier job are never mixed in; parts that are links or belong to another user
are skipped.
"""

import contextlib
import fcntl
import glob
import json
import os
import re

from chainermn_comm import safe_files

__all__ = ['FORMAT_VERSION', 'MERGED_NAME', 'LOCK_NAME', 'part_path', 'write_json', 'write_part',
           'read_parts', 'merge', 'merged_document', 'directory_problem']

#: ``chainermn_trace`` field of every file.
FORMAT_VERSION = 1
MERGED_NAME = 'trace.json'
LOCK_NAME = '.trace.lock'
_PART = re.compile(r'^trace\.rank(\d+)\.json$')


def directory_problem(variable, path):
    """Make the trace directory ``path`` if missing; return why it cannot be used, or None.

    It must be (or become) a directory this process can write, that only this user can write
    (:func:`chainermn_comm.safe_files.check_directory`; ``CHAINERMN_TRUST_SHARED=1`` opts in).
    The text names ``variable`` and the fix.
    """
    head = '{}={!r} cannot be used'.format(variable, path)
    fix = 'Point it at a directory you can write (it is created if missing), or unset it.'
    try:
        if os.path.lexists(path) and not os.path.isdir(path):
            return '{}: it is not a directory. {}'.format(head, fix)
        safe_files.make_directory(path, 'trace directory')
    except safe_files.UntrustedPathError as e:
        return '{}: {}'.format(head, e)
    except OSError as e:
        return '{}: cannot create it ({}). {}'.format(head, e.strerror or e, fix)
    if not os.access(path, os.W_OK | os.X_OK):
        return '{}: this process (uid {}) cannot write it. {}'.format(head, os.geteuid(), fix)
    return None


def part_path(directory, rank):
    """Return the path of ``rank``'s part file in ``directory``."""
    return os.path.join(directory, 'trace.rank{}.json'.format(int(rank)))


def write_json(path, doc):
    """Write ``doc`` as JSON to ``path`` atomically (:func:`chainermn_comm.safe_files.write_text`)."""
    safe_files.write_text(path, json.dumps(doc, separators=(',', ':')))  # the C encoder: dump() is 5x slower


def write_part(directory, doc):
    """Write this rank's part ``doc`` (with its ``rank`` field) into ``directory``; return the path."""
    path = part_path(directory, doc['rank'])
    write_json(path, doc)
    return path


@contextlib.contextmanager
def _locked(directory):
    fd = safe_files.open_lock(os.path.join(directory, LOCK_NAME))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def read_parts(directory):
    """Return every readable part in ``directory`` as ``[(mtime, document)]`` (unreadable ones skipped)."""
    parts = []
    for path in glob.glob(os.path.join(directory, 'trace.rank*.json')):
        if not _PART.match(os.path.basename(path)):
            continue
        try:
            with safe_files.open_trusted(path, 'trace part') as f:
                mtime = os.fstat(f.fileno()).st_mtime
                doc = json.loads(f.read().decode('utf-8'))
        except (OSError, ValueError):   # gone, unreadable, a link or another user's: not ours
            continue
        if isinstance(doc, dict) and doc.get('chainermn_trace') == FORMAT_VERSION:
            parts.append((mtime, doc))
    return parts


def merged_document(docs):
    """Return the merged trace of the part documents ``docs`` (one per rank, one run)."""
    docs = sorted(docs, key=lambda d: d['rank'])
    meta, events, ranks = [], [], {}
    for d in docs:
        for e in d['traceEvents']:
            (meta if e.get('ph') == 'M' else events).append(e)
        ranks[str(d['rank'])] = {
            'host': d['host'], 'clock_offset_us': d['clock']['offset_us'],
            'clock_rtt_us': d['clock']['rtt_us'], 'dropped': d['dropped'],
            'capacity': d['capacity'], 'reason': d['reason']}
    events.sort(key=lambda e: e.get('ts', 0.0))
    size = max([d['size'] for d in docs] or [0])
    return {'traceEvents': meta + events, 'displayTimeUnit': 'ms',
            'otherData': {'chainermn_trace': FORMAT_VERSION, 'size': size,
                          'run': docs[0].get('run') if docs else None, 'ranks': ranks}}


def merge(directory, run=None, require_all=False):
    """Merge the parts of one run in ``directory`` into ``DIR/trace.json``; return its path or None.

    ``run``: the run to merge (default: the run of the newest part).  With ``require_all`` the
    merge happens only when every rank of the run has a part.  None when nothing was merged.
    """
    directory = os.fspath(directory)
    with _locked(directory):
        parts = read_parts(directory)
        if not parts:
            return None
        if run is None:
            run = max(parts, key=lambda p: p[0])[1].get('run')
        docs = {}
        for _, d in parts:
            if d.get('run') == run:
                docs[d['rank']] = d
        if not docs:
            return None
        size = max(d['size'] for d in docs.values())
        if require_all and len(docs) < size:
            return None
        path = os.path.join(directory, MERGED_NAME)
        write_json(path, merged_document(list(docs.values())))
        return path
