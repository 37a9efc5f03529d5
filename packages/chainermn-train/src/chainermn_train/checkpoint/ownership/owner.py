"""Which job writes a checkpoint directory: one owner record per rank, kept fresh while the job lives.

When a checkpointer starts, each rank claims ``<path>/.<name>.<rank>.owner`` (JSON: the job's
token, host, pid, the process's start time, when the job started) under an ``fcntl`` lock on the
directory itself (no lock file is left behind; where the file system cannot lock a directory,
e.g. NFS, claims are not serialized and the run identity of each generation still keeps two jobs'
files apart).  A record of another job that is still alive makes the claim fail, naming
that job; a record of a dead job is taken over (and reported).  Alive means:

- on this host (same host name, boot and PID namespace): the process with the recorded pid
  exists and started at the recorded time (a reused pid is not the job);
- anywhere else (another host, another container): the record's heartbeat is recent.  A thread
  of the owning process touches its record every :data:`HEARTBEAT_SECONDS`; a record untouched
  for :data:`STALE_SECONDS` belongs to a dead job;
- but a record of an earlier attempt of the same launch (``python -m chainermn launch``, a Slurm
  requeue: ``chainermn_comm.launch_status.launch_attempt``) is dead at once, on any host, since a
  launcher starts an attempt only once the one before has ended.

Records are written through ``chainermn_comm.safe_files`` and read only when trusted.
"""

import datetime
import fcntl
import json
import os
import socket
import threading
import time

from chainermn_comm import launch_status, safe_files

__all__ = ['HEARTBEAT_SECONDS', 'STALE_SECONDS', 'record_path', 'identity', 'claim', 'check',
           'release', 'describe']

#: Seconds between two touches of a live job's records.
HEARTBEAT_SECONDS = 30.0
#: Seconds after which a record of another host that was not touched belongs to a dead job.
STALE_SECONDS = 300.0


def record_path(directory, name, rank):
    """Return the path of rank ``rank``'s owner record of snapshots ``name`` in ``directory``."""
    return os.path.join(directory, '.{}.{}.owner'.format(name, int(rank)))


def _read_first_line(path):
    try:
        with open(path) as f:
            return f.readline().strip()
    except OSError:
        return ''


def _start_ticks(pid):
    """Return when process ``pid`` started (clock ticks since boot), or None when there is none (or a zombie)."""
    try:
        with open('/proc/{}/stat'.format(int(pid)), 'rb') as f:
            data = f.read().decode('ascii', 'replace')
        fields = data[data.rindex(')') + 2:].split()
        return None if fields[0] in ('Z', 'X') else int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def identity():
    """Return what identifies this process: host, boot, PID namespace, pid and its start time.

    Also the launcher's attempt (``launch_status.launch_attempt``) when a launcher restarts the job.
    """
    try:
        pidns = os.readlink('/proc/self/ns/pid')
    except OSError:
        pidns = ''
    pid = os.getpid()
    return {'host': socket.gethostname(), 'boot': _read_first_line('/proc/sys/kernel/random/boot_id'),
            'pidns': pidns, 'pid': pid, 'pid_start': _start_ticks(pid),
            'attempt': launch_status.launch_attempt()}


def _same_machine(rec, me):
    return all(rec.get(k) == me[k] for k in ('host', 'boot', 'pidns')) and me['boot'] != ''


def _same_process(rec, me):
    return _same_machine(rec, me) and rec.get('pid') == me['pid'] and \
        rec.get('pid_start') == me['pid_start']


def _earlier_attempt(rec, me):
    # A launcher (``python -m chainermn launch``, a Slurm requeue) starts an attempt only once the
    # one before has ended: a record of an earlier attempt of this launch belongs to a dead job.
    have, mine = rec.get('attempt'), me.get('attempt')
    return isinstance(have, list) and len(have) == 2 and mine is not None and \
        have[0] == mine[0] and isinstance(have[1], int) and have[1] < mine[1]


def _alive(rec, mtime, me, now):
    if _earlier_attempt(rec, me):
        return False
    if _same_machine(rec, me):
        start = _start_ticks(rec.get('pid', -1)) if isinstance(rec.get('pid'), int) else None
        return start is not None and start == rec.get('pid_start')
    return now - mtime < STALE_SECONDS


def describe(rec):
    """Return ``host H, pid P, started T`` for the owner record ``rec``."""
    started = rec.get('started')
    when = (datetime.datetime.fromtimestamp(started).isoformat(sep=' ', timespec='seconds')
            if isinstance(started, (int, float)) else 'at an unknown time')
    return 'host {}, pid {}, started {}'.format(rec.get('host', '?'), rec.get('pid', '?'), when)


def _read(path, allow_shared):
    """Return ``(record or None when it is not a record, mtime)``; untrusted files raise."""
    with safe_files.open_trusted(path, 'owner record', allow_shared=allow_shared) as f:
        mtime = os.fstat(f.fileno()).st_mtime
        try:
            rec = json.loads(f.read(1 << 16).decode('utf-8'))
        except ValueError:
            return None, mtime
    return (rec if isinstance(rec, dict) else None), mtime


def _records(directory, name):
    prefix, suffix = '.{}.'.format(name), '.owner'
    for fn in sorted(os.listdir(directory)):
        middle = fn[len(prefix):-len(suffix)] if fn.startswith(prefix) and fn.endswith(suffix) else ''
        if middle.isascii() and middle.isdigit():
            yield int(middle), os.path.join(directory, fn)


def claim(directory, name, rank, token, started, members=(), allow_shared=None):
    """Claim rank ``rank``'s record for the job ``token``; return ``(conflict, taken_over)``.

    ``conflict`` is None, or the text that names a live job using the directory (nothing was
    written then); ``taken_over`` lists the dead jobs whose records were removed.  Records of
    ``token``, of this process or of one of ``members`` (the :func:`identity` of every rank of
    this job) are this job's.
    """
    me = identity()
    taken = []
    fd = os.open(directory, os.O_RDONLY | getattr(os, 'O_DIRECTORY', 0) | getattr(os, 'O_CLOEXEC', 0))
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:   # no locks on directories here (NFS): the claim is not serialized
            pass
        now = time.time()
        for r, path in _records(directory, name):
            try:
                rec, mtime = _read(path, allow_shared)
            except FileNotFoundError:
                continue
            if rec is not None and (rec.get('token') == token or any(
                    _same_process(rec, m) for m in list(members) + [me])):
                continue
            if rec is not None and _alive(rec, mtime, me, now):
                return ('another job is writing snapshots {!r} into {}: {} (its rank {}; owner '
                        'record {}). Two jobs writing one directory would mix their generations. '
                        'Stop that job, or give this one another path or name. If that job is '
                        'gone, remove {} (a record of another host counts as gone {:.0f} s after '
                        'its last heartbeat).'.format(name, directory, describe(rec), r, path, path,
                                                      STALE_SECONDS)), taken
            safe_files.remove_own(path)
            taken.append('{} (rank {})'.format(describe(rec) if rec else 'an unreadable record', r))
        record = dict(me, token=token, rank=int(rank), started=started)
        safe_files.write_text(record_path(directory, name, rank), json.dumps(record))
    finally:
        os.close(fd)
    _heart.add(record_path(directory, name, rank))
    return None, taken


def check(directory, name, rank, token, allow_shared=None):
    """Return None while rank ``rank``'s record is this job's, else the text that says whose it is."""
    path = record_path(directory, name, rank)
    try:
        rec, _ = _read(path, allow_shared)
    except FileNotFoundError:
        return 'its owner record {} is gone'.format(path)
    if rec is not None and (rec.get('token') == token or _same_process(rec, identity())):
        return None
    return 'its owner record {} now names another job ({})'.format(
        path, describe(rec) if rec else 'unreadable')


def release(directory, name, rank, token, allow_shared=None):
    """Stop the heartbeat of rank ``rank``'s record and remove it if it is still this job's."""
    path = record_path(directory, name, rank)
    _heart.discard(path)
    try:
        rec, _ = _read(path, allow_shared)
    except OSError:
        return
    if rec is not None and rec.get('token') == token:
        safe_files.remove_own(path)


class _Heartbeat:
    """One daemon thread per process that touches the owner records of its live checkpointers."""

    def __init__(self):
        self._paths = set()
        self._lock = threading.Lock()
        self._thread = None

    def add(self, path):
        with self._lock:
            self._paths.add(path)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name='chainermn-checkpoint-owner',
                                                daemon=True)
                self._thread.start()

    def discard(self, path):
        with self._lock:
            self._paths.discard(path)

    def _run(self):
        while True:
            time.sleep(HEARTBEAT_SECONDS)   # a period, not a synchronisation: nothing waits on it
            with self._lock:
                paths = list(self._paths)
            for path in paths:
                if safe_files.is_own_file(path):
                    try:
                        os.utime(path, follow_symlinks=False)
                    except OSError:
                        pass


_heart = _Heartbeat()
