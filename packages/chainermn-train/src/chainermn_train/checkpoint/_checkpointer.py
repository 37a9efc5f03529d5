"""Generational per-rank snapshots that let a whole job resume from the newest common iteration.

Files are named ``<name>.<rank>.<iteration>`` (NumPy ``.npz`` content written by Chainer's
serializers, with no pickled object: see ``_safe_npz``).  Every file is written through
``chainermn_comm.safe_files``: a new file under an unpredictable name in the same directory,
flushed, ``fsync``-ed and renamed over the final name (then the directory is ``fsync``-ed), so a
crash mid-write never leaves a file under a final name and a name planted by someone else is never
followed.  ``save`` is local to the rank (no communication), so it may be called at different
iterations on different ranks (e.g. on preemption); creating the checkpointer and ``maybe_load``
are collectives.

Nothing on disk is trusted by default: the directory must be this user's and writable by nobody
else, and every file read must be a regular file of this user (``allow_shared=True`` or
``CHAINERMN_TRUST_SHARED=1`` opts in); at creation each rank claims the directory for this job
(``_owner``), so a second job writing the same snapshots is refused at start, naming the first.
Loading never unpickles unless the user opts in for files they trust (``allow_pickle=True`` or
``CHAINERMN_ALLOW_PICKLE=1``), and every read is bounded before anything is inflated.

Each file also records its generation (see ``_resize`` and ``_lineage``): the run identity, the
world size and ranks per node that wrote it, the iteration, the epoch, every iterator's position
as a fraction of its epoch and each optimizer's class and state names.  A generation whose files
come from two runs, whose files' contents disagree with their names, or whose optimizer is not this
job's is never loaded (``maybe_load(..., weights_only=True)`` loads the model weights only).  A job
of the same world size resumes bitwise from its own files.  A job of another size (or one whose
ranks lack their own files, e.g. a node with local disks was replaced) takes the state every rank
holds the same from one readable file of the newest usable generation (rank 0's first), sent by
the rank that can read it to all others, and moves each iterator to the same epoch and fraction of
its new shard.  When snapshots exist and none can be used, ``maybe_load`` raises
:class:`SnapshotUnusableError` naming every generation and why it was rejected, unless the caller
opts in to start fresh (``start_fresh=True`` or ``CHAINERMN_START_FRESH=1``).  Files written by a
job of another world size are removed only once a complete generation of the current size exists;
files of another run are never removed.

This module is the extension; its jobs live beside it: ``_writer`` (how a file is written and
removed), ``_policy`` (what may be trusted, the error classes, raising together), ``_owner`` (which
job writes the directory), ``_lineage`` (run identity, optimizer), ``_generations`` (listing,
completeness, garbage collection), ``_load`` (agreement on a generation, resharding) and
``_launch_status`` (progress for ``python -m chainermn launch``).  Each time it runs as an
extension it also compares the model's parameters across ranks (``chainermn_train._fingerprint``).
"""

import os
import sys
import time
import warnings

import chainer
import numpy

from chainermn_comm import safe_files, trace, voice

from chainermn_train import _fingerprint, _trainer_run
from chainermn_train.checkpoint import (_background, _complete, _generations, _launch_status, _lineage,
                                        _load, _made, _owner, _policy, _resize, _safe_npz, _shards,
                                        _staging, _writer)
from chainermn_train.checkpoint._background import kill_point
from chainermn_train.checkpoint._policy import (ALLOW_PICKLE_ENV, START_FRESH_ENV, CheckpointInUseError,
                                                CheckpointWarning, SnapshotUnusableError,
                                                UnsafeCheckpointError)

__all__ = ['MultiNodeCheckpointer', 'create_multi_node_checkpointer', 'create_multi_node_checkpoint',
           'CheckpointWarning', 'SnapshotUnusableError', 'UnsafeCheckpointError',
           'CheckpointInUseError', 'ALLOW_PICKLE_ENV', 'START_FRESH_ENV']


#: ``(directory, name)`` of the stray files already warned about (one warning per process).
_WARNED_STRAY = set()


def _iteration_of(obj):
    if isinstance(obj, chainer.training.Trainer):
        return int(obj.updater.iteration)
    it = getattr(obj, 'iteration', None)
    if isinstance(it, (int, numpy.integer)) and not isinstance(it, bool):
        return int(it)
    return None


class MultiNodeCheckpointer(chainer.training.Extension):
    """Trainer extension saving ``<name>.<rank>.<iteration>`` snapshots; see the module docstring.

    Creating it is a collective (every rank checks the directory, the ranks agree on the run
    identity, and each rank claims the directory for this job; any failure raises the same error
    on every rank).

    Args:
        name (str): identifier of the run (the files' prefix).
        comm: ChainerMN communicator.
        cp_interval (int): minimum number of snapshots (generations) kept per rank.
        gc_interval (int): number of saves between two collections of older snapshots.
        path (str): directory of the snapshots (created if missing; default: current directory).
        allow_pickle (bool or None): let :meth:`maybe_load` unpickle snapshots that need it (files
            written by chainermn before pickle-free snapshots); only for files you trust.  None:
            ``$CHAINERMN_ALLOW_PICKLE`` decides (``1`` allows).  Unpickling warns once per process.
        allow_shared (bool or None): trust a directory that other users own or can write, and
            their files (only for a directory you really share with people you trust).  None:
            ``$CHAINERMN_TRUST_SHARED`` decides.
        background (bool): write snapshots from a background thread (default): a save copies
            what the snapshot holds into host buffers and returns; the write, its ``fsync`` and
            rename go on while training does.  A save that fails is reported and counted, and
            training goes on.  False: every save writes before it returns, and a save that
            fails raises, as before.
        write_timeout (float): longest wait, in seconds, for the write in flight (at the next
            save, at the agreement, at the end); a write still running then is reported.
    """

    trigger = 1, 'epoch'
    priority = chainer.training.PRIORITY_READER  # after every other extension updated its state

    def __init__(self, name, comm, cp_interval=5, gc_interval=5, path=None, allow_pickle=None,
                 allow_shared=None, background=True, write_timeout=600.0):
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
        self.allow_shared = allow_shared
        self.background = bool(background)
        if isinstance(write_timeout, bool) or not isinstance(write_timeout, (int, float)) \
                or not write_timeout > 0:
            raise ValueError('write_timeout must be a positive number of seconds; got {!r}'.format(
                write_timeout))
        self.write_timeout = float(write_timeout)
        self._flight = _background.InFlight()
        self._staging = _staging.Staging()
        self._pending = []      # outcomes of this rank's saves not agreed on yet
        self._committed = set()  # iterations of this run every rank's write of which finished
        #: The run identity written into every snapshot (rank 0's at start; the loaded one's after
        #: a resume).
        self.run_id = None
        self._token = None
        self._started = None
        self._members = []
        self._counter = 0
        self._saves_since_gc = 0
        self._failed = False
        self._trainer = None
        self._launch_status = _launch_status.LaunchStatus(comm)
        _trainer_run.install()
        self._stats = {'saves': 0, 'save_seconds': 0.0, 'bytes_saved': 0, 'loads': 0,
                       'load_seconds': 0.0, 'loaded_iteration': None, 'last_saved_iteration': None,
                       'skipped_unreadable': 0, 'refused_pickle': 0, 'files_removed': 0,
                       'failed_saves': 0, 'wait_seconds': 0.0, 'write_seconds': 0.0}
        self._start()

    @property
    def default_name(self):
        return 'MultiNodeCheckpointer'

    # -- the directory and who writes it ----------------------------------------------
    def _directory_problem(self):
        try:
            made = safe_files.make_directory(self.path, 'checkpoint directory', self.allow_shared)
        except OSError as e:   # UntrustedPathError among them
            return e
        # A completed run removes the checkpoint directory again when it made it and it is empty
        # (_made); parents it made stay: they are the trainer's ``out`` or the user's, written after.
        made = [p for p in made if os.path.abspath(p) == os.path.abspath(self.path)]
        if made:
            _made.record(self.path, self.name, self.comm.rank, made, self.allow_shared)
        return None

    def _claim(self, taken_out=None):
        """Claim this rank's owner record; return the problem (an exception) or None.

        The dead jobs whose records were taken over are warned about, or added to ``taken_out``.
        """
        try:
            conflict, taken = _owner.claim(self.path, self.name, self.comm.rank, self._token,
                                           self._started, self._members, self.allow_shared)
        except OSError as e:
            return e
        if conflict is not None:
            return CheckpointInUseError('chainermn checkpoint: ' + conflict)
        if taken and taken_out is not None:
            taken_out.extend(taken)
        elif taken:
            warnings.warn('rank {}: took over the snapshots {!r} in {} from job(s) that are gone: {}'
                          .format(self.comm.rank, self.name, self.path, '; '.join(taken)),
                          CheckpointWarning, stacklevel=4)
        return None

    def _start(self):
        """Check the directory, agree on the run identity and claim the directory (collective)."""
        _policy.agree(self.comm, self._directory_problem())
        views = self.comm.allgather_obj((_lineage.new_run_id(), time.time(), _owner.identity()))
        self._token, self._started = views[0][:2]
        self._members = [v[2] for v in views]   # this job's processes: their records are ours
        self.run_id = self._token
        taken = []
        problem = self._claim(taken)
        try:
            _policy.agree(self.comm, problem)
        except BaseException:
            if problem is None:   # this rank's claim stands, but the job does not start
                self._release()
            raise
        taken = [t for ts in self.comm.allgather_obj(taken) for t in ts]
        if taken:   # one warning for the job (every rank warns, rank 0 shows it)
            voice.warn_all('took over the snapshots {!r} in {} from job(s) that are gone: {}'.format(
                self.name, self.path, '; '.join(taken)), CheckpointWarning, self.comm.rank, stacklevel=4)

    def _readiness_problem(self):
        """Return why this rank cannot write now (the directory, or this job's claim on it), or None."""
        problem = self._directory_problem()
        if problem is None and _owner.check(self.path, self.name, self.comm.rank, self._token,
                                            self.allow_shared) is not None:
            problem = self._claim()   # the record was removed or replaced: claim again
        return problem

    def _ensure_ready(self):
        """Before a save (not a collective): raise here, on this rank only, unless it can write.

        The other ranks are not in a collective call with this one (each saves on its own), so
        the error is never answered with one: the job ends through the rules for a rank that leaves.
        """
        problem = self._readiness_problem()
        if problem is not None:
            raise problem

    def _release(self):
        _owner.release(self.path, self.name, self.comm.rank, self._token, self.allow_shared)

    # -- files ------------------------------------------------------------------------
    def filename(self, iteration, rank=None):
        """Return the path of the snapshot of ``rank`` (default: this rank) at ``iteration``."""
        rank = self.comm.rank if rank is None else rank
        return os.path.join(self.path, '{}.{}.{}'.format(self.name, rank, int(iteration)))

    def _tmp_prefix(self):
        return '.{}.{}.'.format(self.name, self.comm.rank)

    def local_iterations(self):
        """Return the sorted iterations this rank has a snapshot file for."""
        return sorted(it for r, it in self.visible_files() if r == self.comm.rank)

    def visible_files(self):
        """Return the sorted ``(rank, iteration)`` of every snapshot file of this name in the directory.

        Other names that start with ``<name>.`` are ignored, with one warning (per process, on the
        first rank of each node).
        """
        stray = []
        files = _generations.list_files(self.path, self.name, stray)
        new = sorted({(self.path, n) for n in stray} - _WARNED_STRAY)
        if new:
            _WARNED_STRAY.update(new)
            new = [n for _, n in new]
            if getattr(self.comm, 'intra_rank', 0) == 0:
                warnings.warn('rank {}: ignoring {} file(s) in {} whose names start with {!r} but are '
                              'not {}.<rank>.<iteration> in ASCII digits: {}; they are neither loaded '
                              'nor removed'.format(self.comm.rank, len(new), self.path, self.name + '.',
                                                   self.name, ', '.join(repr(n) for n in new[:8])),
                              CheckpointWarning, stacklevel=3)
        return files

    def _meta_of(self, iteration, rank):
        """Return the metadata of a file, or ``(kind, why)`` when it cannot be used."""
        return _generations.read_meta(self.filename(iteration, rank), self.allow_shared, rank,
                                      iteration)

    def _scan(self):
        """Return ``{(iteration, rank): meta or (kind, why)}`` for the files this rank sees."""
        return {(it, r): self._meta_of(it, r) for r, it in self.visible_files()}

    # -- saving -----------------------------------------------------------------------
    def __call__(self, trainer):
        self._trainer = trainer
        self._check_parameters(trainer)   # here, not in save: save is not a collective
        self.settle()   # every rank calls the extension at the same iteration
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
        with trace.span('checkpoint save', 'io'):
            if self.background:
                return self._save_background(obj, iteration)
            return self._save(obj, iteration)

    def _iteration(self, obj, iteration):
        if iteration is None:
            iteration = _iteration_of(obj)
        if iteration is None:
            iteration = self._counter + 1
        return int(iteration)

    def _save(self, obj, iteration):
        start = time.monotonic()
        iteration = self._iteration(obj, iteration)
        self._ensure_ready()
        final = self.filename(iteration)
        meta = self._meta(obj, iteration)
        size = _writer.write_atomically(final, lambda f: _safe_npz.write(f, obj, meta))
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

    # -- saving in the background ---------------------------------------------------------
    def _save_background(self, obj, iteration):
        """Copy the snapshot into the staging buffers and start its write; return the file name.

        A save that cannot be made (the write before it never finished, the directory cannot be
        written) returns None; it is reported at the next agreement (or at the end) and counted.
        """
        start = time.monotonic()
        iteration = self._iteration(obj, iteration)
        kill_point('before-copy', self.comm.rank)
        if not self._drain():   # the staging buffers are still being written
            self._pending.append(_background.Outcome(iteration, error=TimeoutError(
                'the write of iteration {} before it had not finished after {:.0f} s'.format(
                    self._flight_iteration(), self.write_timeout))))
            return None
        problem = self._readiness_problem()
        if problem is not None:
            self._pending.append(_background.Outcome(iteration, error=problem))
            return None
        final = self.filename(iteration)
        meta = self._meta(obj, iteration)
        meta[_complete.BACKGROUND_KEY] = 1
        arrays = _safe_npz.to_arrays(self._staging.copy(_staging.capture(obj)), meta)
        kill_point('after-copy', self.comm.rank)
        rank = self.comm.rank
        self._flight.start(iteration, lambda: _writer.write_atomically(
            final, lambda f: _safe_npz.write_arrays(f, arrays), rank))
        self._counter = iteration
        self._saves_since_gc += 1
        if self._saves_since_gc >= self.gc_interval:
            self._saves_since_gc = 0
            self.collect()
        self._stats['save_seconds'] += time.monotonic() - start
        return final

    def _flight_iteration(self):
        return self._flight._iteration

    def _drain(self, timeout=None):
        """Wait (bounded) for this rank's write in flight and keep its outcome; return whether none is left.

        Not a collective.  The wait is its own trace event (``checkpoint wait``).
        """
        if not self._flight.busy:
            return True
        start = time.monotonic()
        with trace.span('checkpoint wait', 'io'):
            outcome = self._flight.wait(self.write_timeout if timeout is None else timeout)
        self._stats['wait_seconds'] += time.monotonic() - start
        if outcome is None:
            return True
        self._pending.append(outcome)
        if outcome.ok:
            st = self._stats
            st['saves'] += 1
            st['bytes_saved'] += outcome.size
            st['write_seconds'] += outcome.seconds
            st['last_saved_iteration'] = outcome.iteration
        if len(self._pending) > 8:   # saves without agreements between them: say it here
            self._report_alone(self._pending[:-8])
            del self._pending[:-8]
        return outcome.finished

    def _report_alone(self, outcomes):
        """Report, on this rank only (no agreement comes), the saves among ``outcomes`` that failed."""
        for o in outcomes:
            if not o.ok:
                self._stats['failed_saves'] += 1
                self._stats.setdefault('failed_alone', 0)
                self._stats['failed_alone'] += 1
                warnings.warn('rank {}: the snapshot of iteration {} of {!r} was not written: {}; '
                              'the newest complete generation stays'.format(
                                  self.comm.rank, o.iteration, self.name, o.why()),
                              CheckpointWarning, stacklevel=4)

    def settle(self):
        """Wait for this rank's write in flight, agree on every rank's, and record complete generations.

        Collective: every rank calls it at the same point (the extension does before each save;
        the preemption handler after its save).  A generation is recorded complete when every
        rank's write of it finished.  A save that failed on any rank is reported once for the job
        (naming the ranks and why), counted, and the files the other ranks wrote of it are
        removed: the newest complete generation stays and the next save tries again.
        """
        self._drain()
        mine = [(o.iteration, o.ok, o.why()) for o in self._pending]
        self._pending = []
        kill_point('before-agreement', self.comm.rank)
        views = self.comm.allgather_obj(mine)
        reports = {}
        for r, outcomes in enumerate(views):
            for it, ok, why in outcomes:
                reports.setdefault(it, {})[r] = (ok, why)
        failed = sorted(it for it, rs in reports.items() if any(not ok for ok, _ in rs.values()))
        done = sorted(it for it, rs in reports.items()
                      if it not in failed and len(rs) == self.comm.size)
        for it in failed:
            self._stats['failed_saves'] += 1
            if reports[it].get(self.comm.rank, (False,))[0]:
                self._remove(self.filename(it))   # an incomplete generation is not kept
        if done:
            self._committed.update(done)
            kill_point('before-record', self.comm.rank)
            self._write_record()
            kill_point('after-record', self.comm.rank)
        if failed:
            newest = max(self._committed) if self._committed else None
            voice.warn_all('chainermn checkpoint {!r}: {}; the files of it that were written are '
                           'removed, the newest complete generation ({}) stays, training goes on and '
                           'the next save tries again'.format(
                               self.name, '; '.join('the save of iteration {} failed on rank(s) {}'
                                                    .format(it, ', '.join(
                                                        '{} ({})'.format(r, why) for r, (ok, why)
                                                        in sorted(reports[it].items()) if not ok))
                                                    for it in failed),
                               'iteration {}'.format(newest) if newest is not None else 'none yet'),
                           CheckpointWarning, self.comm.rank, stacklevel=3)
        return done[-1] if done else None

    def _write_record(self):
        mine = set(self.local_iterations())
        try:
            _complete.write_record(self.path, self.name, self.comm.rank, self.run_id,
                                   sorted(self._committed & mine))
        except OSError as e:
            warnings.warn('rank {}: could not record the complete generations of {!r} in {}: {}; '
                          'they still load while every rank\'s file of them is on disk'.format(
                              self.comm.rank, self.name, self.path, e), CheckpointWarning, stacklevel=4)

    def _complete_floor(self, files, meta_of):
        """Return the newest iteration known complete (agreed, or every rank's file seen), or -1."""
        size = self.comm.size
        by_it = {}
        for r, it in files:
            by_it.setdefault(it, set()).add(r)
        seen = [it for it, ranks in by_it.items() if all(r in ranks for r in range(size)) and all(
            isinstance(meta_of(it, r), dict) and meta_of(it, r).get('world_size') == size
            for r in range(size))]
        return max(list(self._committed) + seen + [-1])

    def _meta(self, obj, iteration):
        meta = _resize.generation_meta(obj, self.comm, iteration)
        meta[_lineage.RUN_KEY] = self.run_id
        meta.update(_lineage.optimizer_meta(obj))
        meta.update(_shards.meta())
        return meta

    def collect(self):
        """Remove this rank's snapshots older than the newest ``cp_interval`` ones.

        Only files of this run (or written before runs were recorded) that this user owns are
        removed.  Files written by a job of another world size (and, on rank 0, files of ranks that
        this job does not have) are kept until a complete generation of the current size is on disk.
        """
        metas = {}

        def meta_of(it, r):
            if (it, r) not in metas:
                metas[(it, r)] = self._meta_of(it, r)
            return metas[(it, r)]

        files = self.visible_files()
        floor = self._complete_floor(files, meta_of) if self.background else None
        for r, it in _generations.files_to_collect(files, self.comm.rank, self.comm.size,
                                                   self.cp_interval, meta_of, self.run_id, floor):
            self._remove(self.filename(it, r))

    def _remove(self, fn):
        if _writer.remove_file(fn):
            self._stats['files_removed'] += 1

    def _remove_stale_tmp(self):
        _writer.remove_stale_tmp(self.path, self._tmp_prefix())

    # -- loading ----------------------------------------------------------------------

    def maybe_load(self, trainer, optimizer=None, allow_pickle=None, start_fresh=None,
                   weights_only=False):
        """Resume every rank from the newest usable snapshot generation; see the module docstring.

        ``trainer`` may be a Trainer or any object saved with :meth:`save`.  Collective.  On the same
        world size every rank loads its own file of the newest iteration all ranks can read
        (bitwise resume).  Otherwise (another world size, or ranks without their own files) every
        rank loads the shared state of one readable file of the newest usable generation and the
        updater's iterators are moved to the same epoch and fraction of their new shard.  When
        ``optimizer`` is a multi-node optimizer, it skips its next parameter broadcast.  Returns
        the loaded iteration, or None when there is no snapshot at all.  The job takes over the
        run identity of what it loaded.

        Snapshots that need pickle are refused (``CheckpointWarning`` naming the file and keys;
        an older generation is used) unless ``allow_pickle`` (default: the checkpointer's
        ``allow_pickle``, else ``$CHAINERMN_ALLOW_PICKLE``) is true.  A generation written with
        another optimizer (class or state names) is refused, naming both; ``weights_only=True``
        loads only the models' parameters and persistents of the updater's optimizers (everything
        for a Link), leaves the iteration, optimizer state, iterators and extensions as they are
        and keeps this job's run identity.  When snapshots exist but none can be used, every rank
        raises :class:`SnapshotUnusableError` (or :class:`UnsafeCheckpointError` when some were
        refused for pickle) naming each generation, the world size it needs and why it was
        rejected; ``start_fresh=True`` (or ``$CHAINERMN_START_FRESH=1``) returns None instead.
        No file is deleted either way.  A file that is a link or another user's raises
        ``UntrustedPathError`` on every rank.
        """
        with trace.span('checkpoint load', 'io'):
            loaded = _load.load(self, trainer, optimizer, allow_pickle, start_fresh, weights_only)
        # Follows the iterations from now on: added after loading, snapshots never need its state.
        self._launch_status.loaded(loaded, trainer)
        return loaded

    def _prepare_load(self):
        """Check the directory and this job's claim on every rank, together; remove stale temporaries."""
        self._drain()
        _policy.agree(self.comm, self._readiness_problem())
        self._remove_stale_tmp()

    def _check_parameters(self, obj):
        """Warn once when the ranks' parameters differ (all ranks take part; see ``_fingerprint``)."""
        target = _fingerprint.model_of(obj)
        if target is not None:
            _fingerprint.check_same_parameters(self.comm, target, 'the checkpointer')

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
        """Wait for the write in flight; remove this rank's snapshots when the run completed; let go of the directory.

        Not a collective (it also runs when one rank failed).  The wait is bounded by
        ``write_timeout``: a write that has not finished is reported, and so is every save that
        failed since the last agreement; rank 0 says how many saves of the job failed.  After a
        completed run, the last rank to finish also removes the directories that the
        checkpointer made, when they are empty (``_made``).
        """
        self._drain()
        self._report_alone(self._pending)
        self._pending = []
        failed = self._stats['failed_saves']
        alone = self._stats.get('failed_alone', 0)
        if failed - alone and self.comm.rank == 0:   # agreed: the same count on every rank
            warnings.warn('chainermn checkpoint {!r}: {} save(s) of the job failed (each was reported '
                          'when it failed)'.format(self.name, failed - alone), CheckpointWarning,
                          stacklevel=2)
        if self._flight.busy:
            warnings.warn('rank {}: the snapshot write of iteration {} of {!r} had not finished after '
                          '{:.0f} s; that generation is incomplete and will not be loaded'.format(
                              self.comm.rank, self._flight_iteration(), self.name, self.write_timeout),
                          CheckpointWarning, stacklevel=2)
        completed = self._completed()
        if completed:
            self.cleanup()
        self._release()
        if completed:
            _made.remove_if_empty(self.path, self.name, self.allow_shared)

    def cleanup(self):
        """Remove this rank's snapshot files of this run (rank 0: also ranks this job lacks).

        Files of another run, links and other users' files are left alone.
        """
        for r, it in self.visible_files():
            if r == self.comm.rank or (self.comm.rank == 0 and r >= self.comm.size):
                meta = self._meta_of(it, r)
                if isinstance(meta, dict) and _lineage.run_of(meta) not in (None, self.run_id):
                    continue
                self._remove(self.filename(it, r))
        _complete.remove_record(self.path, self.name, self.comm.rank)
        self._committed.clear()
        self._remove_stale_tmp()

    def get_stats(self):
        """Return a dict of counters: saves, bytes, seconds, loads, removed files, ..."""
        st = dict(self._stats)
        st['rank'] = self.comm.rank
        st['path'] = self.path
        st['run_id'] = self.run_id
        st['local_iterations'] = self.local_iterations()
        st['background'] = self.background
        st['in_flight'] = self._flight_iteration() if self._flight.busy else None
        st['staging_bytes'] = self._staging.nbytes
        return st


def create_multi_node_checkpointer(name, comm, cp_interval=5, gc_interval=5, path=None,
                                   allow_pickle=None, allow_shared=None, background=True,
                                   write_timeout=600.0):
    """Create a multi-node checkpointer (snapshots ``<name>.<rank>.<iteration>`` under ``path``).

    Collective.  ``background=True`` (default) writes each snapshot from a background thread
    while training goes on; ``background=False`` writes it before ``save`` returns.  ``allow_pickle=True`` lets it load snapshots that need pickle (only for files you
    trust); None leaves the choice to ``$CHAINERMN_ALLOW_PICKLE``.  ``allow_shared=True`` trusts
    a directory other users can write (only one you really share); None leaves the choice to
    ``$CHAINERMN_TRUST_SHARED``.
    """
    return MultiNodeCheckpointer(name, comm, cp_interval=cp_interval, gc_interval=gc_interval,
                                 path=path, allow_pickle=allow_pickle, allow_shared=allow_shared,
                                 background=background, write_timeout=write_timeout)


#: The manual's spelling of :func:`create_multi_node_checkpointer`.
create_multi_node_checkpoint = create_multi_node_checkpointer
