"""Generational per-rank snapshots that let a whole job resume from the newest common iteration.

Files are named ``<name>.<rank>.<iteration>`` (NumPy ``.npz`` content written by Chainer's
serializers, with no pickled object: see ``_safe_npz``).  A snapshot is written to a hidden
temporary file in the same directory, flushed, ``fsync``-ed and renamed over the final name with
``os.replace`` (then the directory is ``fsync``-ed), so a crash mid-write never leaves a file under
a final name.  ``save`` is local to
the rank (no communication), so it may be called at different iterations on different ranks
(e.g. on preemption); ``maybe_load`` is a collective.

Loading never unpickles unless the user opts in for files they trust (``allow_pickle=True`` or
``CHAINERMN_ALLOW_PICKLE=1``): a snapshot that needs pickle is refused like an unreadable one, and
the ranks fall back to an older generation that every rank can read.
"""

import os
import stat
import sys
import time
import warnings

import chainer
import numpy

from chainermn_train.extensions import _safe_npz

__all__ = ['MultiNodeCheckpointer', 'create_multi_node_checkpointer', 'create_multi_node_checkpoint',
           'CheckpointWarning', 'UnsafeCheckpointError', 'ALLOW_PICKLE_ENV']

#: Environment variable that lets ``maybe_load`` unpickle snapshots (``1``) when the code does not
#: pass ``allow_pickle``; only for files you trust.
ALLOW_PICKLE_ENV = 'CHAINERMN_ALLOW_PICKLE'

_OPT_IN_HINT = ('if you trust the file(s), opt in to pickle with create_multi_node_checkpointer(..., '
                'allow_pickle=True), maybe_load(..., allow_pickle=True) or {}=1; otherwise remove '
                'them'.format(ALLOW_PICKLE_ENV))
_pickle_warned = False  # the opt-in warns once per process
_TRUE = ('1', 'true', 'yes', 'on')
_FALSE = ('', '0', 'false', 'no', 'off')


class CheckpointWarning(UserWarning):
    """Warned when a snapshot cannot be used, when pickle is used, or for an unsafe directory."""


class UnsafeCheckpointError(RuntimeError):
    """Raised by ``maybe_load`` when no snapshot can be loaded and some were refused for pickle."""


def _allow_pickle(explicit):
    """Return ``(allowed, how)``: the explicit argument if given, else ``$CHAINERMN_ALLOW_PICKLE``."""
    if explicit is not None:
        return bool(explicit), 'the allow_pickle=True argument'
    value = os.environ.get(ALLOW_PICKLE_ENV, '').strip()
    if value.lower() not in _TRUE + _FALSE:
        raise ValueError('{}={!r} is not understood; set it to 1 to let the checkpointer unpickle '
                         'snapshots you trust, or 0 (or leave it unset) to refuse them'.format(
                             ALLOW_PICKLE_ENV, value))
    return value.lower() in _TRUE, '{}={}'.format(ALLOW_PICKLE_ENV, value)


def _warn_pickle_once(rank, path, keys, how):
    global _pickle_warned
    if _pickle_warned:
        return
    _pickle_warned = True
    warnings.warn('rank {}: unpickled key(s) {} of {} because of {}; unpickling runs any code the file '
                  'names, so only do this for snapshots you trust (this warning is shown once per '
                  'process)'.format(rank, ', '.join(repr(k) for k in keys[:8]), path, how),
                  CheckpointWarning, stacklevel=5)


def _directory_problem(path):
    """Return why other users could write snapshots into the directory ``path``, or None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    problems = []
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        problems.append('world-writable without the sticky bit')
    geteuid = getattr(os, 'geteuid', None)
    if geteuid is not None and st.st_uid != geteuid():
        problems.append('owned by uid {} while this process runs as uid {}'.format(
            st.st_uid, geteuid()))
    if not problems:
        return None
    return ('checkpoint directory {} (mode {:04o}, {}) is {}: other users can put snapshots there that '
            'this job resumes from; use a directory only you can write to (e.g. chmod o-w)'.format(
                path, stat.S_IMODE(st.st_mode), stat.filemode(st.st_mode), ' and '.join(problems)))


def _fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _iteration_of(obj):
    if isinstance(obj, chainer.training.Trainer):
        return int(obj.updater.iteration)
    it = getattr(obj, 'iteration', None)
    if isinstance(it, (int, numpy.integer)) and not isinstance(it, bool):
        return int(it)
    return None


class MultiNodeCheckpointer(chainer.training.Extension):
    """Trainer extension saving ``<name>.<rank>.<iteration>`` snapshots; see the module docstring.

    Args:
        name (str): identifier of the run (the files' prefix).
        comm: ChainerMN communicator.
        cp_interval (int): minimum number of snapshots (generations) kept per rank.
        gc_interval (int): number of saves between two collections of older snapshots.
        path (str): directory of the snapshots (created if missing; default: current directory).
        allow_pickle (bool or None): let :meth:`maybe_load` unpickle snapshots that need it (files
            written by chainermn before pickle-free snapshots); only for files you trust.  None:
            ``$CHAINERMN_ALLOW_PICKLE`` decides (``1`` allows).  Unpickling warns once per process.
    """

    trigger = 1, 'epoch'
    priority = chainer.training.PRIORITY_READER  # after every other extension updated its state

    def __init__(self, name, comm, cp_interval=5, gc_interval=5, path=None, allow_pickle=None):
        if not isinstance(name, str) or not name or os.sep in name or (os.altsep and os.altsep in name):
            raise ValueError('checkpointer name must be a non-empty string without path separators; '
                             'got {!r}'.format(name))
        for what, v in (('cp_interval', cp_interval), ('gc_interval', gc_interval)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError('{} must be a positive int; got {!r}'.format(what, v))
        self.name = name
        self.comm = comm
        self.cp_interval = cp_interval
        self.gc_interval = gc_interval
        self.path = os.path.abspath(path if path is not None else os.getcwd())
        self.allow_pickle = allow_pickle
        self._dir_checked = False
        self._counter = 0
        self._saves_since_gc = 0
        self._failed = False
        self._trainer = None
        self._stats = {'saves': 0, 'save_seconds': 0.0, 'bytes_saved': 0, 'loads': 0,
                       'load_seconds': 0.0, 'loaded_iteration': None, 'last_saved_iteration': None,
                       'skipped_unreadable': 0, 'refused_pickle': 0, 'files_removed': 0}
        if os.path.isdir(self.path):
            self._check_directory()

    @property
    def default_name(self):
        return 'MultiNodeCheckpointer'

    # -- files ------------------------------------------------------------------------
    def filename(self, iteration, rank=None):
        """Return the path of the snapshot of ``rank`` (default: this rank) at ``iteration``."""
        rank = self.comm.rank if rank is None else rank
        return os.path.join(self.path, '{}.{}.{}'.format(self.name, rank, int(iteration)))

    def _makedirs(self):
        os.makedirs(self.path, exist_ok=True)
        self._check_directory()

    def _check_directory(self):
        """Warn (once) when other users can write into the snapshot directory."""
        if self._dir_checked:
            return
        self._dir_checked = True
        problem = _directory_problem(self.path)
        if problem is not None:
            warnings.warn('rank {}: {}'.format(self.comm.rank, problem), CheckpointWarning, stacklevel=3)

    def _tmp_prefix(self):
        return '.{}.{}.'.format(self.name, self.comm.rank)

    def local_iterations(self):
        """Return the sorted iterations this rank has a snapshot file for."""
        prefix = '{}.{}.'.format(self.name, self.comm.rank)
        out = []
        try:
            entries = os.listdir(self.path)
        except FileNotFoundError:
            return out
        for fn in entries:
            if fn.startswith(prefix):
                rest = fn[len(prefix):]
                if rest.isdigit():
                    out.append(int(rest))
        return sorted(out)

    # -- saving -----------------------------------------------------------------------
    def __call__(self, trainer):
        self._trainer = trainer
        self.save(trainer)

    def initialize(self, trainer):
        self._trainer = trainer

    def save(self, obj, iteration=None):
        """Write this rank's snapshot of ``obj`` (a Trainer or any serializable object) atomically.

        The file holds no pickled object (``None`` values are listed by name); a value that only
        pickle could store raises ``TypeError`` naming its key.
        The iteration is ``iteration`` if given, else the trainer's (or ``obj.iteration``), else
        one more than the last saved/loaded one.  Not a collective.  Returns the file name.
        """
        start = time.monotonic()
        if iteration is None:
            iteration = _iteration_of(obj)
        if iteration is None:
            iteration = self._counter + 1
        iteration = int(iteration)
        self._makedirs()
        final = self.filename(iteration)
        tmp = os.path.join(self.path, '{}{}.tmp{}'.format(self._tmp_prefix(), iteration, os.getpid()))
        try:
            with open(tmp, 'wb') as f:
                _safe_npz.write(f, obj)
                f.flush()
                os.fsync(f.fileno())
                size = f.tell()
            os.replace(tmp, final)
        except BaseException:
            try:
                os.remove(tmp)
            except OSError:
                pass
            raise
        _fsync_dir(self.path)
        self._counter = iteration
        st = self._stats
        st['saves'] += 1
        st['bytes_saved'] += size
        st['last_saved_iteration'] = iteration
        self._saves_since_gc += 1
        if self._saves_since_gc >= self.gc_interval:
            self._saves_since_gc = 0
            self.collect()
        st['save_seconds'] += time.monotonic() - start
        return final

    def collect(self):
        """Remove this rank's snapshots older than the newest ``cp_interval`` ones."""
        its = self.local_iterations()
        for it in its[:-self.cp_interval]:
            self._remove(self.filename(it))

    def _remove(self, fn):
        try:
            os.remove(fn)
            self._stats['files_removed'] += 1
        except FileNotFoundError:
            pass

    def _remove_stale_tmp(self):
        prefix = self._tmp_prefix()
        try:
            entries = os.listdir(self.path)
        except FileNotFoundError:
            return
        for fn in entries:
            if fn.startswith(prefix) and '.tmp' in fn:
                try:
                    os.remove(os.path.join(self.path, fn))
                except OSError:
                    pass

    # -- loading ----------------------------------------------------------------------
    def _read(self, iteration, allow_pickle, how):
        """Return ``(values, None)``, or ``(None, (kind, why))`` when this rank cannot use the file.

        ``kind`` is ``'refused'`` (it needs pickle, not allowed) or ``'unreadable'`` (missing,
        truncated, corrupt, not a snapshot).
        """
        fn = self.filename(iteration)
        try:
            values, pickled = _safe_npz.read(fn, allow_pickle=allow_pickle)
        except _safe_npz.PickleRequired as e:
            return None, ('refused', str(e))
        except Exception as e:  # truncated, corrupt, missing: all mean "cannot use this one"
            return None, ('unreadable', '{}: {}'.format(type(e).__name__, e))
        if pickled:
            _warn_pickle_once(self.comm.rank, fn, pickled, how)
        return values, None

    def _agree_on_generation(self, candidates, allow_pickle, how):
        """Return ``(iteration, values, refused)`` for the newest candidate every rank can read.

        Collective.  Candidates are tried newest first; each rank reads its own file and the ranks
        exchange what went wrong.  ``refused`` lists ``(rank, why)`` of the files refused for
        needing pickle on the way; iteration and values are None when no candidate works.
        """
        refused = []
        for it in sorted(candidates, reverse=True):
            values, problem = self._read(it, allow_pickle, how)
            # Only short status tuples are exchanged, between the ranks of this job (MPI).
            problems = self.comm.allgather_obj(problem)
            bad = [(r, p[0], p[1]) for r, p in enumerate(problems) if p is not None]
            if not bad:
                return it, values, refused
            self._stats['skipped_unreadable'] += 1
            refused_here = [(r, why) for r, kind, why in bad if kind == 'refused']
            if refused_here:
                self._stats['refused_pickle'] += 1
                refused += refused_here
            if problem is not None or self.comm.rank == 0:
                warnings.warn(
                    'rank {}: cannot use the snapshots of iteration {} ({}); falling back to an '
                    'older common iteration{}'.format(
                        self.comm.rank, it, '; '.join(
                            'rank {} {}: {}'.format(r, self.filename(it, r),
                                                    'refused: ' + why if kind == 'refused' else why)
                            for r, kind, why in bad),
                        ' ({})'.format(_OPT_IN_HINT) if refused_here else ''),
                    CheckpointWarning, stacklevel=3)
        return None, None, refused

    def maybe_load(self, trainer, optimizer=None, allow_pickle=None):
        """Resume every rank from the newest iteration all ranks have a readable snapshot of.

        ``trainer`` may be a Trainer or any object saved with :meth:`save`.  Collective.  When a
        snapshot is loaded and ``optimizer`` is a multi-node optimizer, it skips its next
        parameter broadcast (the ranks are in step already).  Returns the loaded iteration or
        None (nothing loaded; ``trainer.updater.iteration`` stays 0).

        Snapshots that need pickle are refused (``CheckpointWarning`` naming the file and keys;
        an older generation is used) unless ``allow_pickle`` (default: the checkpointer's
        ``allow_pickle``, else ``$CHAINERMN_ALLOW_PICKLE``) is true.  When snapshots exist but
        none can be loaded and some were refused, every rank raises :class:`UnsafeCheckpointError`.
        """
        start = time.monotonic()
        allowed, how = _allow_pickle(allow_pickle if allow_pickle is not None else self.allow_pickle)
        self._makedirs()
        self._remove_stale_tmp()
        lists = self.comm.allgather_obj(self.local_iterations())
        common = set(lists[0])
        for lst in lists[1:]:
            common &= set(lst)
        it, values, refused = self._agree_on_generation(common, allowed, how)
        if it is None:
            self._stats['load_seconds'] += time.monotonic() - start
            if refused:
                raise UnsafeCheckpointError(
                    'rank {}: no generation of the snapshots {!r} in {} can be used and some were '
                    'refused because loading them needs pickle; nothing was loaded. Refused: {}. '
                    'To load them anyway: {}'.format(
                        self.comm.rank, self.name, self.path,
                        '; '.join('rank {}: {}'.format(r, why) for r, why in refused), _OPT_IN_HINT))
            return None
        chainer.serializers.NpzDeserializer(values).load(trainer)
        if optimizer is not None and hasattr(optimizer, '_mn_mark_synced'):
            optimizer._mn_mark_synced()
        self._counter = it
        st = self._stats
        st['loads'] += 1
        st['loaded_iteration'] = it
        st['load_seconds'] += time.monotonic() - start
        return it

    # -- end of training --------------------------------------------------------------
    def on_error(self, trainer, exc, tb):
        self._failed = True

    def _completed(self):
        if self._failed or sys.exc_info()[0] is not None:
            return False
        trainer = self._trainer
        if trainer is None:
            return True
        length = getattr(trainer.stop_trigger, 'get_training_length', None)
        if length is None:
            return True
        period, unit = length()
        if unit == 'iteration':
            return trainer.updater.iteration >= period
        return trainer.updater.epoch_detail >= period

    def finalize(self):
        """Remove this rank's snapshots when the training run completed without an error."""
        if self._completed():
            self.cleanup()

    def cleanup(self):
        """Remove every snapshot file of this rank for this run's name."""
        for it in self.local_iterations():
            self._remove(self.filename(it))
        self._remove_stale_tmp()

    def get_stats(self):
        """Return a dict of counters: saves, bytes, seconds, loads, removed files, ..."""
        st = dict(self._stats)
        st['rank'] = self.comm.rank
        st['path'] = self.path
        st['local_iterations'] = self.local_iterations()
        return st


def create_multi_node_checkpointer(name, comm, cp_interval=5, gc_interval=5, path=None,
                                   allow_pickle=None):
    """Create a multi-node checkpointer (snapshots ``<name>.<rank>.<iteration>`` under ``path``).

    ``allow_pickle=True`` lets it load snapshots that need pickle (only for files you trust);
    None leaves the choice to ``$CHAINERMN_ALLOW_PICKLE``.
    """
    return MultiNodeCheckpointer(name, comm, cp_interval=cp_interval, gc_interval=gc_interval,
                                 path=path, allow_pickle=allow_pickle)


#: The manual's spelling of :func:`create_multi_node_checkpointer`.
create_multi_node_checkpoint = create_multi_node_checkpointer
