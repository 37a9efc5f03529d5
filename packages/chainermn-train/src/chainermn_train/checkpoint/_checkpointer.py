"""Generational per-rank snapshots that let a whole job resume from the newest common iteration.

Files are named ``<name>.<rank>.<iteration>`` (NumPy ``.npz`` content written by Chainer's
serializers, with no pickled object: see ``read.npz``).  By default a save copies the snapshot into
host buffers and a background thread writes it (``write.saving``); ``settle`` agrees which
generations every rank finished (``write.complete``), also polled for every iteration while a write
is unsettled (``poll``).  Every file is written through ``chainermn_comm.safe_files``: a new file
under an unpredictable name in the same directory, flushed, ``fsync``-ed and renamed over the final
name (then the directory is ``fsync``-ed), so a crash mid-write never leaves a file under a final
name and a name planted by someone else is never followed.  ``save`` is local to the rank (no
communication), so it may be called at different iterations on different ranks (e.g. on
preemption); creating the checkpointer and ``maybe_load`` are collectives.

Nothing on disk is trusted by default: the directory must be this user's and writable by nobody
else, and every file read must be a regular file of this user (``allow_shared=True`` or
``CHAINERMN_TRUST_SHARED=1`` opts in); at creation each rank claims the directory for this job
(``ownership.owner``), so a second job writing the same snapshots is refused at start, naming the
first.  Loading never unpickles unless the user opts in for files they trust (``allow_pickle=True``
or ``CHAINERMN_ALLOW_PICKLE=1``), and every read is bounded before anything is inflated.

Each file also records its generation (see ``reshard.resize`` and ``read.lineage``): the run
identity, the world size and ranks per node that wrote it, the iteration, the epoch, every
iterator's position as a fraction of its epoch and each optimizer's class and state names.  A
generation whose files come from two runs, whose files' contents disagree with their names, or
whose optimizer is not this job's is never loaded (``maybe_load(..., weights_only=True)`` loads the
model weights only).  A job of the same world size resumes bitwise from its own files.  A job of
another size (or one whose ranks lack their own files, e.g. a node with local disks was replaced)
takes the state every rank holds the same from one readable file of the newest usable generation
(rank 0's first), sent by the rank that can read it to all others, and moves each iterator to the
same epoch and fraction of its new shard.  When snapshots exist and none can be used,
``maybe_load`` raises :class:`SnapshotUnusableError` naming every generation and why it was
rejected, unless the caller opts in to start fresh (``start_fresh=True`` or
``CHAINERMN_START_FRESH=1``).  Files written by a job of another world size are removed only once a
complete generation of the current size exists; files of another run are never removed.

This module is the extension; its jobs live in the subpackages beside it, ``write``, ``read``,
``reshard`` and ``ownership`` (see the package docstring), and in ``_launch_status`` (progress for
``python -m chainermn launch``).  As an extension it also compares the model's parameters across
ranks (``chainermn_train._fingerprint``).
"""

import os
import time
import warnings

import chainer

from chainermn_comm import safe_files, trace, voice

from chainermn_train import _fingerprint, _trainer_run
from chainermn_train.checkpoint import _launch_status
from chainermn_train.checkpoint.ownership import made as made_dirs, owner, trust
from chainermn_train.checkpoint.read import generations, lineage, load
from chainermn_train.checkpoint.write import (background as write_background, complete, saving, staging,
                                              writer)
from chainermn_train.checkpoint.ownership.trust import (ALLOW_PICKLE_ENV, START_FRESH_ENV, CheckpointInUseError,
                                                        CheckpointWarning, SnapshotUnusableError,
                                                        UnsafeCheckpointError)

__all__ = ['MultiNodeCheckpointer', 'create_multi_node_checkpointer', 'create_multi_node_checkpoint',
           'CheckpointWarning', 'SnapshotUnusableError', 'UnsafeCheckpointError',
           'CheckpointInUseError', 'ALLOW_PICKLE_ENV', 'START_FRESH_ENV']


#: ``(directory, name)`` of the stray files already warned about (one warning per process).
_WARNED_STRAY = set()


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
        background (bool): a save copies the snapshot into host buffers and a background thread
            writes it (default; a failing save is reported and counted).  False: written (or
            raised) before ``save`` returns.
        write_timeout (float): longest wait (seconds) for the write in flight; then it is reported.
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
            raise ValueError('write_timeout must be a positive number of seconds; got {!r}'
                             .format(write_timeout))
        self.write_timeout = float(write_timeout)
        self._flight = write_background.InFlight()
        self._staging = staging.Staging()
        self._pending = []      # outcomes of this rank's saves not agreed on yet
        self._armed = False     # a save of the extension is unsettled: its trigger polls
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
        self._stats = {'saves': 0, 'save_seconds': 0.0, 'bytes_saved': 0, 'loads': 0, 'load_seconds': 0.0,
                       'loaded_iteration': None, 'last_saved_iteration': None, 'skipped_unreadable': 0,
                       'refused_pickle': 0, 'files_removed': 0, 'failed_saves': 0, 'wait_seconds': 0.0,
                       'write_seconds': 0.0, 'polls': 0, 'poll_seconds': 0.0}
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
        # (ownership.made); parents it made stay: they are the trainer's ``out`` or the user's,
        # written after.
        made = [p for p in made if os.path.abspath(p) == os.path.abspath(self.path)]
        if made:
            made_dirs.record(self.path, self.name, self.comm.rank, made, self.allow_shared)
        return None

    def _claim(self, taken_out=None):
        """Claim this rank's owner record; return the problem (an exception) or None.

        The dead jobs whose records were taken over are warned about, or added to ``taken_out``.
        """
        try:
            conflict, taken = owner.claim(self.path, self.name, self.comm.rank, self._token,
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
        trust.agree(self.comm, self._directory_problem())
        views = self.comm.allgather_obj((lineage.new_run_id(), time.time(), owner.identity()))
        self._token, self._started = views[0][:2]
        self._members = [v[2] for v in views]   # this job's processes: their records are ours
        self.run_id = self._token
        taken = []
        problem = self._claim(taken)
        try:
            trust.agree(self.comm, problem)
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
        if problem is None and owner.check(self.path, self.name, self.comm.rank, self._token,
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
        owner.release(self.path, self.name, self.comm.rank, self._token, self.allow_shared)

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
        files = generations.list_files(self.path, self.name, stray)
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
        return generations.read_meta(self.filename(iteration, rank), self.allow_shared, rank,
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
        self._armed = self.background   # on every rank: its trigger polls from the next iteration

    def initialize(self, trainer):
        self._trainer = trainer
        saving.follow(self, trainer)   # background: agree on each write soon after its end

    def save(self, obj, iteration=None):
        """Write this rank's snapshot of ``obj`` (a Trainer or any serializable object) atomically.

        The file holds no pickled object (``None`` values are listed by name); a value that only
        pickle could store raises ``TypeError`` naming its key.
        The iteration is ``iteration`` if given, else the trainer's (or ``obj.iteration``), else
        one more than the last saved/loaded one.  Not a collective.  Returns the file name; in
        the background it is written after the return (None: this save failed, see ``settle``).
        """
        with trace.span('checkpoint save', 'io'):
            if self.background:
                return saving.save_background(self, obj, iteration)
            return saving.save_sync(self, obj, iteration)

    def settle(self):
        """Wait for this rank's write, agree on every rank's, record complete generations; return the newest.

        Collective (every rank at the same point; None when none was found complete): ``saving.settle``.
        """
        return saving.settle(self)

    def poll(self):
        """Settle once no rank's write is still running; return whether nothing is left unsettled.

        Collective and cheap (``saving.poll``): a loop without a trainer calls it on every rank at
        the same point, e.g. every iteration; the extension's trigger polls by itself.
        """
        return saving.poll(self)

    def _drain(self, timeout=None):
        return saving.drain(self, timeout)

    def collect(self, remove=None):
        """Remove this rank's snapshots older than the newest ``cp_interval`` ones (or ``remove(file)``).

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
        floor = saving.complete_floor(self, files, meta_of) if self.background else None
        for r, it in generations.files_to_collect(files, self.comm.rank, self.comm.size,
                                                  self.cp_interval, meta_of, self.run_id, floor):
            (remove or self._remove)(self.filename(it, r))

    def _remove(self, fn):
        if writer.remove_file(fn):
            self._stats['files_removed'] += 1

    def _remove_stale_tmp(self):
        writer.remove_stale_tmp(self.path, self._tmp_prefix())

    # -- loading ----------------------------------------------------------------------

    def maybe_load(self, trainer, optimizer=None, allow_pickle=None, start_fresh=None,
                   weights_only=False):
        """Resume every rank from the newest usable snapshot generation; see the module docstring.

        ``trainer`` may be a Trainer or any object saved with :meth:`save`.  Collective.  On the same world
        size every rank loads its own file of the newest iteration all ranks can read (bitwise resume).
        Otherwise (another world size, or ranks without their own files) every rank loads the shared state of
        one readable file of the newest usable generation and the updater's iterators are moved to the same
        epoch and fraction of their new shard.  When ``optimizer`` is a multi-node optimizer, it skips its
        next parameter broadcast.  Returns the loaded iteration, or None when there is no snapshot at all.
        The job takes over the run identity of what it loaded.

        Snapshots that need pickle are refused (``CheckpointWarning`` naming the file and keys; an older
        generation is used) unless ``allow_pickle`` (default: the checkpointer's ``allow_pickle``, else
        ``$CHAINERMN_ALLOW_PICKLE``) is true.  A generation written with another optimizer (class or state
        names) is refused, naming both; ``weights_only=True`` loads only the models' parameters and
        persistents of the updater's optimizers (everything for a Link), leaves the iteration, optimizer
        state, iterators and extensions as they are and keeps this job's run identity.  When snapshots exist
        but none can be used, every rank raises :class:`SnapshotUnusableError` (or
        :class:`UnsafeCheckpointError` when some were refused for pickle) naming each generation, the world
        size it needs and why it was rejected; ``start_fresh=True`` (or ``$CHAINERMN_START_FRESH=1``) returns
        None instead. No file is deleted either way, also at ``finalize``.  A link or another user's file raises
        ``UntrustedPathError`` on every rank.
        """
        try:
            with trace.span('checkpoint load', 'io'):
                loaded = load.load(self, trainer, optimizer, allow_pickle, start_fresh, weights_only)
        except BaseException:   # a checkpointer whose load raised never removes a file
            self._failed = True
            raise
        self._launch_status.loaded(loaded, trainer)   # added after loading: snapshots never need its state
        return loaded

    def _prepare_load(self):
        """Wait for this process's writes in flight; check the directory and claim (all ranks); tidy up."""
        self._drain()
        write_background.join_others(self._flight, self.write_timeout)
        trust.agree(self.comm, self._readiness_problem())
        self._remove_stale_tmp()

    def _check_parameters(self, obj):
        """Warn once when the ranks' parameters differ (all ranks take part; see ``_fingerprint``)."""
        target = _fingerprint.model_of(obj)
        if target is not None:
            _fingerprint.check_same_parameters(self.comm, target, 'the checkpointer')

    def on_error(self, trainer, exc, tb):
        self._failed = True

    def _completed(self):
        return saving.completed(self)

    def finalize(self):
        """Wait for the write in flight; remove this rank's snapshots after a completed run; let go.

        Not a collective (it also runs when one rank failed).  The wait is bounded by
        ``write_timeout``: a write that has not finished is reported, and so is every save that
        failed since the last agreement; rank 0 says how many saves of the job failed.  After a
        completed run, the last rank to finish also removes the directories that the
        checkpointer made, when they are empty (``ownership.made``).
        """
        saving.finish(self)
        completed = self._completed()
        if completed:
            self.cleanup()
        self._release()
        if completed:
            made_dirs.remove_if_empty(self.path, self.name, self.allow_shared)

    def cleanup(self):
        """Remove this rank's snapshot files of this run (rank 0: also ranks this job lacks).

        Files of another run, links and other users' files are left alone.
        """
        for r, it in self.visible_files():
            if r == self.comm.rank or (self.comm.rank == 0 and r >= self.comm.size):
                meta = self._meta_of(it, r)
                if isinstance(meta, dict) and lineage.run_of(meta) not in (None, self.run_id):
                    continue
                self._remove(self.filename(it, r))
        complete.remove_record(self.path, self.name, self.comm.rank)
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
        st['in_flight'] = saving.flight_iteration(self) if self._flight.busy else None
        st['staging_bytes'] = self._staging.nbytes
        return st


def create_multi_node_checkpointer(name, comm, cp_interval=5, gc_interval=5, path=None,
                                   allow_pickle=None, allow_shared=None, background=True,
                                   write_timeout=600.0):
    """Create a multi-node checkpointer (snapshots ``<name>.<rank>.<iteration>`` under ``path``).

    Collective.  ``background=True`` (default) copies each snapshot into host buffers and writes
    it from a background thread while training goes on; ``background=False`` writes it before
    ``save`` returns.
    ``allow_pickle=True`` lets it load snapshots that need pickle (only for files you trust);
    None leaves the choice to ``$CHAINERMN_ALLOW_PICKLE``.  ``allow_shared=True`` trusts a
    directory other users can write (only one you really share); None: ``$CHAINERMN_TRUST_SHARED``.
    """
    return MultiNodeCheckpointer(name, comm, cp_interval=cp_interval, gc_interval=gc_interval,
                                 path=path, allow_pickle=allow_pickle, allow_shared=allow_shared,
                                 background=background, write_timeout=write_timeout)


#: The manual's spelling of :func:`create_multi_node_checkpointer`.
create_multi_node_checkpoint = create_multi_node_checkpointer
