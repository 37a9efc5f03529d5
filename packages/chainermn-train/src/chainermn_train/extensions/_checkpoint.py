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

Each file also records its generation (see ``_resize``): the world size and ranks per node that
wrote it, the iteration, the epoch and every iterator's position as a fraction of its epoch.  A job
of the same world size resumes bitwise from its own files.  A job of another size (or one whose
ranks lack their own files, e.g. a node with local disks was replaced) takes the state every rank
holds the same from one readable file of the newest usable generation (rank 0's first), sent by
the rank that can read it to all others, and moves each iterator to the same epoch and fraction of
its new shard.  When snapshots exist and none can be used, ``maybe_load`` raises
:class:`SnapshotUnusableError` naming every generation and why it was rejected, unless the caller
opts in to start fresh (``start_fresh=True`` or ``CHAINERMN_START_FRESH=1``).  Files written by a
job of another world size are removed only once a complete generation of the current size exists.
"""

import io
import os
import stat
import sys
import time
import warnings

import chainer
import numpy

from chainermn_train.extensions import _resize, _safe_npz

__all__ = ['MultiNodeCheckpointer', 'create_multi_node_checkpointer', 'create_multi_node_checkpoint',
           'CheckpointWarning', 'SnapshotUnusableError', 'UnsafeCheckpointError', 'ALLOW_PICKLE_ENV',
           'START_FRESH_ENV']

#: Environment variable that lets ``maybe_load`` unpickle snapshots (``1``) when the code does not
#: pass ``allow_pickle``; only for files you trust.
ALLOW_PICKLE_ENV = 'CHAINERMN_ALLOW_PICKLE'
#: Environment variable that lets ``maybe_load`` start from iteration 0 (``1``) when snapshots
#: exist but none can be used (default: raise :class:`SnapshotUnusableError`).
START_FRESH_ENV = 'CHAINERMN_START_FRESH'
#: Set by ``python -m chainermn launch``: rank 0 then prints a line after the first iteration.
ELASTIC_ENV = 'CHAINERMN_ELASTIC'
#: Set by ``python -m chainermn launch``: a file where rank 0 writes the iteration after each one.
PROGRESS_ENV = 'CHAINERMN_LAUNCH_PROGRESS'
_PROGRESS_EXT = 'chainermn_launch_progress'

_OPT_IN_HINT = ('if you trust the file(s), opt in to pickle with create_multi_node_checkpointer(..., '
                'allow_pickle=True), maybe_load(..., allow_pickle=True) or {}=1; otherwise remove '
                'them'.format(ALLOW_PICKLE_ENV))
_pickle_warned = False  # the opt-in warns once per process
_TRUE = ('1', 'true', 'yes', 'on')
_FALSE = ('', '0', 'false', 'no', 'off')


class CheckpointWarning(UserWarning):
    """Warned when a snapshot cannot be used, when pickle is used, or for an unsafe directory."""


class SnapshotUnusableError(RuntimeError):
    """Raised by ``maybe_load`` when snapshots exist but none can be used (nothing is deleted)."""


class UnsafeCheckpointError(SnapshotUnusableError):
    """Raised by ``maybe_load`` when no snapshot can be loaded and some were refused for pickle."""


def _env_flag(name, what_true, what_false):
    value = os.environ.get(name, '').strip()
    if value.lower() not in _TRUE + _FALSE:
        raise ValueError('{}={!r} is not understood; set it to 1 to {}, or 0 (or leave it unset) to '
                         '{}'.format(name, value, what_true, what_false))
    return value.lower() in _TRUE, '{}={}'.format(name, value)


def _allow_pickle(explicit):
    """Return ``(allowed, how)``: the explicit argument if given, else ``$CHAINERMN_ALLOW_PICKLE``."""
    if explicit is not None:
        return bool(explicit), 'the allow_pickle=True argument'
    return _env_flag(ALLOW_PICKLE_ENV, 'let the checkpointer unpickle snapshots you trust',
                     'refuse them')


def _start_fresh(explicit):
    if explicit is not None:
        return bool(explicit)
    return _env_flag(START_FRESH_ENV, 'start from iteration 0 when no snapshot can be used',
                     'raise an error then')[0]


def _warn_pickle_once(rank, path, keys, how):
    global _pickle_warned
    if _pickle_warned:
        return
    _pickle_warned = True
    warnings.warn('rank {}: unpickled key(s) {} of {} because of {}; unpickling runs any code the file '
                  'names, so only do this for snapshots you trust (this warning is shown once per '
                  'process)'.format(rank, ', '.join(repr(k) for k in keys[:8]), path, how),
                  CheckpointWarning, stacklevel=6)


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
        return sorted(it for r, it in self.visible_files() if r == self.comm.rank)

    def visible_files(self):
        """Return the sorted ``(rank, iteration)`` of every snapshot file of this name in the directory."""
        prefix = self.name + '.'
        out = []
        try:
            entries = os.listdir(self.path)
        except FileNotFoundError:
            return out
        for fn in entries:
            if fn.startswith(prefix):
                parts = fn[len(prefix):].split('.')
                if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
                    out.append((int(parts[0]), int(parts[1])))
        return sorted(out)

    def _meta_of(self, iteration, rank):
        """Return the metadata of a file, or ``(kind, why)`` when it cannot be read."""
        try:
            return _safe_npz.read_meta(self.filename(iteration, rank))
        except _safe_npz.PickleRequired as e:
            return ('refused', str(e))
        except Exception as e:
            return ('unreadable', '{}: {}'.format(type(e).__name__, e))

    def _scan(self):
        """Return ``{(iteration, rank): meta or (kind, why)}`` for the files this rank sees."""
        return {(it, r): self._meta_of(it, r) for r, it in self.visible_files()}

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
                _safe_npz.write(f, obj, _resize.generation_meta(obj, self.comm, iteration))
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

    def _world_size_of(self, iteration, rank):
        meta = self._meta_of(iteration, rank)
        return meta.get('world_size') if isinstance(meta, dict) else None

    def _complete_generation_exists(self, files):
        """Return whether every rank of this world size has a file of one iteration written at this size."""
        size = self.comm.size
        by_it = {}
        for r, it in files:
            by_it.setdefault(it, set()).add(r)
        for it, ranks in by_it.items():
            if all(r in ranks for r in range(size)) and all(
                    self._world_size_of(it, r) == size for r in range(size)):
                return True
        return False

    def collect(self):
        """Remove this rank's snapshots older than the newest ``cp_interval`` ones.

        Files written by a job of another world size (and, on rank 0, files of ranks that this job
        does not have) are kept until a complete generation of the current size is on disk.
        """
        size, rank = self.comm.size, self.comm.rank
        files = self.visible_files()
        its = [it for r, it in files if r == rank]
        current = [it for it in its if self._world_size_of(it, rank) == size]
        older = [(rank, it) for it in its if it not in current]
        if rank == 0:
            older += [(r, it) for r, it in files if r >= size]
        if older and self._complete_generation_exists(files):
            for r, it in older:
                self._remove(self.filename(it, r))
        for it in current[:-self.cp_interval]:
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
    def _read(self, iteration, allow_pickle, how, expected=None, source=None):
        """Return ``(values, None)``, or ``(None, (kind, why))`` when this rank cannot use the file.

        ``kind`` is ``'refused'`` (it needs pickle, not allowed) or ``'unreadable'`` (missing,
        truncated, corrupt, not a snapshot, or lacking a key of ``expected``).  ``source`` (bytes)
        replaces reading the file.  Metadata keys are removed from ``values``.
        """
        fn = self.filename(iteration)
        try:
            values, pickled = _safe_npz.read(fn if source is None else io.BytesIO(source),
                                             allow_pickle=allow_pickle)
        except _safe_npz.PickleRequired as e:
            return None, ('refused', str(e))
        except Exception as e:  # truncated, corrupt, missing: all mean "cannot use this one"
            return None, ('unreadable', '{}: {}'.format(type(e).__name__, e))
        if pickled:
            _warn_pickle_once(self.comm.rank, fn, pickled, how)
        _safe_npz.split_meta(values)
        problem = _resize.mismatches(expected, values)
        if problem is not None:
            return None, ('unreadable', 'a valid snapshot file that ' + problem)
        return values, None

    def _agree_on_generation(self, candidates, allow_pickle, how, expected=None, rejected=None):
        """Return ``(iteration, values, refused)`` for the newest candidate every rank can read.

        Collective.  Candidates are tried newest first; each rank reads its own file and the ranks
        exchange what went wrong.  ``refused`` lists ``(rank, why)`` of the files refused for
        needing pickle on the way; iteration and values are None when no candidate works.
        """
        refused = []
        for it in sorted(candidates, reverse=True):
            values, problem = self._read(it, allow_pickle, how, expected)
            # Only short status tuples are exchanged, between the ranks of this job (MPI).
            problems = self.comm.allgather_obj(problem)
            bad = [(r, p[0], p[1]) for r, p in enumerate(problems) if p is not None]
            if not bad:
                return it, values, refused
            if rejected is not None:
                rejected.setdefault(it, []).extend(
                    'rank {} {}: {}'.format(r, self.filename(it, r), why) for r, _, why in bad)
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
                    CheckpointWarning, stacklevel=4)
        return None, None, refused

    def maybe_load(self, trainer, optimizer=None, allow_pickle=None, start_fresh=None):
        """Resume every rank from the newest usable snapshot generation; see the module docstring.

        ``trainer`` may be a Trainer or any object saved with :meth:`save`.  Collective.  On the same
        world size every rank loads its own file of the newest iteration all ranks can read
        (bitwise resume).  Otherwise (another world size, or ranks without their own files) every
        rank loads the shared state of one readable file of the newest usable generation and the
        updater's iterators are moved to the same epoch and fraction of their new shard.  When
        ``optimizer`` is a multi-node optimizer, it skips its next parameter broadcast.  Returns
        the loaded iteration, or None when there is no snapshot at all.

        Snapshots that need pickle are refused (``CheckpointWarning`` naming the file and keys;
        an older generation is used) unless ``allow_pickle`` (default: the checkpointer's
        ``allow_pickle``, else ``$CHAINERMN_ALLOW_PICKLE``) is true.  When snapshots exist but
        none can be used, every rank raises :class:`SnapshotUnusableError` (or
        :class:`UnsafeCheckpointError` when some were refused for pickle) naming each generation,
        the world size it needs and why it was rejected; ``start_fresh=True`` (or
        ``$CHAINERMN_START_FRESH=1``) returns None instead.  No file is deleted either way.
        """
        loaded = self._load(trainer, optimizer, allow_pickle, start_fresh)
        self._report_progress(trainer)   # added after loading: snapshots never need its state
        return loaded

    def _load(self, trainer, optimizer, allow_pickle, start_fresh):
        """Do the work of :meth:`maybe_load`."""
        start = time.monotonic()
        allowed, how = _allow_pickle(allow_pickle if allow_pickle is not None else self.allow_pickle)
        fresh_ok = _start_fresh(start_fresh)
        self._makedirs()
        self._remove_stale_tmp()
        local = {}
        expected = _resize.expected_keys(trainer, local)
        views = self.comm.allgather_obj(self._scan())
        size, rank = self.comm.size, self.comm.rank
        gens = {}
        for q, view in enumerate(views):
            for (it, r), meta in view.items():
                gens.setdefault(it, {}).setdefault(r, []).append((q, meta))
        rejected = {}
        exact = [it for it, files in gens.items() if all(
            any(q == k and (not isinstance(m, dict) or m.get('world_size', size) == size)
                for q, m in files.get(k, ())) for k in range(size))]
        it, values, refused = self._agree_on_generation(exact, allowed, how, expected, rejected)
        mode = 'same world size, own files'
        if it is None:
            it, values, refused2, mode = self._reshard(trainer, gens, allowed, how, expected, rejected,
                                                       local)
            refused += refused2
        st = self._stats
        if it is None:
            st['load_seconds'] += time.monotonic() - start
            if not gens:
                return None
            summary = self._summary(gens, rejected)
            if fresh_ok:
                if rank == 0:
                    warnings.warn('no snapshot generation of {!r} in {} can be used; starting from '
                                  'iteration 0 as asked (start_fresh). {}'.format(
                                      self.name, self.path, summary), CheckpointWarning, stacklevel=3)
                return None
            if refused:
                raise UnsafeCheckpointError(
                    'rank {}: no generation of the snapshots {!r} in {} can be used and some were '
                    'refused because loading them needs pickle; nothing was loaded. Refused: {}. '
                    'To load them anyway: {}. {}'.format(
                        rank, self.name, self.path,
                        '; '.join('rank {}: {}'.format(r, why) for r, why in refused), _OPT_IN_HINT,
                        summary))
            raise SnapshotUnusableError(
                'rank {}: snapshots {!r} exist in {} but no generation can be used by this job of {} '
                'rank(s); nothing was loaded and nothing was deleted. {} Fix or remove the files, or '
                'pass maybe_load(..., start_fresh=True) (or {}=1) to start from iteration 0.'.format(
                    rank, self.name, self.path, size, summary, START_FRESH_ENV))
        try:
            chainer.serializers.NpzDeserializer(values).load(trainer)
        except KeyError as e:
            raise SnapshotUnusableError(
                'rank {}: the snapshot of iteration {} lacks key {} that this job needs while loading; '
                'the job is not the one that wrote it'.format(rank, it, e)) from None
        if optimizer is not None and hasattr(optimizer, '_mn_mark_synced'):
            optimizer._mn_mark_synced()
        self._counter = it
        st['loads'] += 1
        st['loaded_iteration'] = it
        st['load_mode'] = mode
        st['load_seconds'] += time.monotonic() - start
        if rank == 0:
            sys.stderr.write('chainermn checkpoint: loaded generation {} of {!r} ({}; {} rank(s) now)\n'
                             .format(it, self.name, mode, size))
            sys.stderr.flush()
        return it

    def _report_progress(self, trainer):
        """Under ``python -m chainermn launch``: tell the launcher, from rank 0, how far training got.

        Prints a line after the first iteration and, when ``$CHAINERMN_LAUNCH_PROGRESS`` names a
        file, writes the iteration there after every iteration (the launcher counts redone work).
        """
        if not os.environ.get(ELASTIC_ENV) or not isinstance(trainer, chainer.training.Trainer):
            return
        if self.comm.rank != 0 or _PROGRESS_EXT in trainer._extensions:
            return
        progress = os.environ.get(PROGRESS_ENV)
        state = {'first': True}

        def report(t):
            if state['first']:
                state['first'] = False
                sys.stderr.write('chainermn checkpoint: first iteration done: {}\n'.format(
                    t.updater.iteration))
                sys.stderr.flush()
            if progress:   # atomic, so that a rank killed mid-write leaves the last value
                try:
                    with open(progress + '.tmp', 'w') as f:
                        f.write('{}\n'.format(t.updater.iteration))
                    os.replace(progress + '.tmp', progress)
                except OSError:
                    pass

        trainer.extend(report, name=_PROGRESS_EXT, trigger=(1, 'iteration'),
                       priority=chainer.training.PRIORITY_READER)

    def _summary(self, gens, rejected):
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

    def _reshard(self, trainer, gens, allowed, how, expected, rejected, local):
        """Load the shared state of one readable file of the newest usable generation on every rank.

        Collective.  Returns ``(iteration, values, refused, mode)``; iteration is None if none works.
        """
        rank = self.comm.rank
        refused = []
        for it in sorted(gens, reverse=True):
            files = gens[it]
            donors = []
            for r in sorted(files):
                seen = [(q, m) for q, m in files[r]]
                metas = [m for _, m in seen if isinstance(m, dict)]
                if not metas:
                    rejected.setdefault(it, []).append('rank {} {}: {}'.format(
                        r, self.filename(it, r), seen[0][1][1]))
                    if seen[0][1][0] == 'refused':
                        refused.append((r, seen[0][1][1]))
                    continue
                if 'world_size' not in metas[0]:
                    rejected.setdefault(it, []).append(
                        'rank {} {}: written without generation metadata (by an older chainermn), so it '
                        'can only resume a job of the world size that wrote it, with every rank\'s own '
                        'file'.format(r, self.filename(it, r)))
                    continue
                readers = [q for q, m in seen if isinstance(m, dict)]
                donors.append((r, r if r in readers else readers[0], metas[0]))
            for r, q, meta in donors:
                problem, data = None, None
                if rank == q:
                    try:
                        with open(self.filename(it, r), 'rb') as f:
                            data = f.read()
                        _safe_npz.read(io.BytesIO(data), allow_pickle=allowed)
                    except _safe_npz.PickleRequired as e:
                        problem = ('refused', str(e))
                    except Exception as e:
                        problem = ('unreadable', '{}: {}'.format(type(e).__name__, e))
                problem = self.comm.bcast_obj(problem, root=q)
                if problem is not None:
                    rejected.setdefault(it, []).append('rank {} {}: {}'.format(
                        r, self.filename(it, r), problem[1]))
                    if problem[0] == 'refused':
                        refused.append((r, problem[1]))
                    continue
                buf = self.comm.bcast(numpy.frombuffer(data, dtype=numpy.uint8) if rank == q else None,
                                      root=q)
                values, mine = self._read(it, allowed, how, source=buf.tobytes())
                if mine is None:
                    _resize.fill_local(values, local)   # e.g. rank 0's LogReport from another rank's file
                    try:
                        _resize.rebuild_iterator_values(trainer, values, meta, rank)
                    except Exception as e:
                        mine = ('unreadable', '{}: {}'.format(type(e).__name__, e))
                if mine is None:
                    problem = _resize.mismatches(expected, values)
                    if problem is not None:
                        mine = ('mismatch', problem)
                problems = self.comm.allgather_obj(mine)
                by_reason = {}
                for k, p in enumerate(problems):
                    if p is not None:
                        by_reason.setdefault(p[1], []).append(str(k))
                if by_reason:
                    rejected.setdefault(it, []).append('{} (world size {}) sent by rank {}: {}'.format(
                        self.filename(it, r), meta['world_size'], q, '; '.join(
                            'rank(s) {}: {}'.format(','.join(ks), why) for why, ks in by_reason.items())))
                    if any(p is not None and p[0] == 'mismatch' for p in problems):
                        break   # every file of a generation holds the same shared state
                    continue
                mode = 'resharded from {} (world size {}, {} rank(s) per node)'.format(
                    self.filename(it, r), meta['world_size'], meta.get('ranks_per_node', '?'))
                return it, values, refused, mode
        return None, None, refused, None

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
        """Remove every snapshot file of this rank for this run's name (rank 0: also ranks this job lacks)."""
        for r, it in self.visible_files():
            if r == self.comm.rank or (self.comm.rank == 0 and r >= self.comm.size):
                self._remove(self.filename(it, r))
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
