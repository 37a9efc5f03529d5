"""Generational per-rank snapshots that let a whole job resume from the newest common iteration.

Files are named ``<name>.<rank>.<iteration>`` (NumPy ``.npz`` content written by Chainer's
serializers).  A snapshot is written to a hidden temporary file in the same directory, flushed,
``fsync``-ed and renamed over the final name with ``os.replace`` (then the directory is
``fsync``-ed), so a crash mid-write never leaves a file under a final name.  ``save`` is local to
the rank (no communication), so it may be called at different iterations on different ranks
(e.g. on preemption); ``maybe_load`` is a collective.
"""

import os
import sys
import time
import warnings

import chainer
import numpy

__all__ = ['MultiNodeCheckpointer', 'create_multi_node_checkpointer', 'create_multi_node_checkpoint',
           'CheckpointWarning']


class CheckpointWarning(UserWarning):
    """Warned when a snapshot file cannot be read and an older one is used instead."""


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
    """

    trigger = 1, 'epoch'
    priority = chainer.training.PRIORITY_READER  # after every other extension updated its state

    def __init__(self, name, comm, cp_interval=5, gc_interval=5, path=None):
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
        self._counter = 0
        self._saves_since_gc = 0
        self._failed = False
        self._trainer = None
        self._stats = {'saves': 0, 'save_seconds': 0.0, 'bytes_saved': 0, 'loads': 0,
                       'load_seconds': 0.0, 'loaded_iteration': None, 'last_saved_iteration': None,
                       'skipped_unreadable': 0, 'files_removed': 0}

    @property
    def default_name(self):
        return 'MultiNodeCheckpointer'

    # -- files ------------------------------------------------------------------------
    def filename(self, iteration, rank=None):
        """Return the path of the snapshot of ``rank`` (default: this rank) at ``iteration``."""
        rank = self.comm.rank if rank is None else rank
        return os.path.join(self.path, '{}.{}.{}'.format(self.name, rank, int(iteration)))

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

        The iteration is ``iteration`` if given, else the trainer's (or ``obj.iteration``), else
        one more than the last saved/loaded one.  Not a collective.  Returns the file name.
        """
        start = time.monotonic()
        if iteration is None:
            iteration = _iteration_of(obj)
        if iteration is None:
            iteration = self._counter + 1
        iteration = int(iteration)
        os.makedirs(self.path, exist_ok=True)
        final = self.filename(iteration)
        tmp = os.path.join(self.path, '{}{}.tmp{}'.format(self._tmp_prefix(), iteration, os.getpid()))
        try:
            with open(tmp, 'wb') as f:
                chainer.serializers.save_npz(f, obj, compression=False)
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
    def _read(self, iteration):
        """Return (dict of every array in the file, None) or (None, reason) if it is unreadable."""
        fn = self.filename(iteration)
        try:
            with numpy.load(fn, allow_pickle=True) as npz:
                return {k: npz[k] for k in npz.files}, None
        except Exception as e:  # truncated, corrupt, missing: all mean "cannot use this one"
            return None, '{}: {}'.format(type(e).__name__, e)

    def maybe_load(self, trainer, optimizer=None):
        """Resume every rank from the newest iteration all ranks have a readable snapshot of.

        ``trainer`` may be a Trainer or any object saved with :meth:`save`.  Collective.  When a
        snapshot is loaded and ``optimizer`` is a multi-node optimizer, it skips its next
        parameter broadcast (the ranks are in step already).  Returns the loaded iteration or
        None (nothing loaded; ``trainer.updater.iteration`` stays 0).
        """
        start = time.monotonic()
        os.makedirs(self.path, exist_ok=True)
        self._remove_stale_tmp()
        lists = self.comm.allgather_obj(self.local_iterations())
        common = set(lists[0])
        for lst in lists[1:]:
            common &= set(lst)
        for it in sorted(common, reverse=True):
            data, reason = self._read(it)
            reasons = self.comm.allgather_obj(reason)
            bad = [(r, why) for r, why in enumerate(reasons) if why is not None]
            if bad:
                self._stats['skipped_unreadable'] += 1
                if reason is not None or self.comm.rank == 0:
                    warnings.warn(
                        'rank {}: cannot use the snapshots of iteration {} ({}); falling back to an '
                        'older common iteration'.format(
                            self.comm.rank, it, '; '.join('rank {} {}: {}'.format(
                                r, self.filename(it, r), why) for r, why in bad)),
                        CheckpointWarning, stacklevel=2)
                continue
            deserializer = chainer.serializers.NpzDeserializer(data)
            deserializer.load(trainer)
            if optimizer is not None and hasattr(optimizer, '_mn_mark_synced'):
                optimizer._mn_mark_synced()
            self._counter = it
            st = self._stats
            st['loads'] += 1
            st['loaded_iteration'] = it
            st['load_seconds'] += time.monotonic() - start
            return it
        self._stats['load_seconds'] += time.monotonic() - start
        return None

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


def create_multi_node_checkpointer(name, comm, cp_interval=5, gc_interval=5, path=None):
    """Create a multi-node checkpointer (snapshots ``<name>.<rank>.<iteration>`` under ``path``)."""
    return MultiNodeCheckpointer(name, comm, cp_interval=cp_interval, gc_interval=gc_interval,
                                 path=path)


#: The manual's spelling of :func:`create_multi_node_checkpointer`.
create_multi_node_checkpoint = create_multi_node_checkpointer
