"""How a snapshot is saved: written before ``save`` returns, or copied and written in the background.

A background save (``save_background``) waits for the write in flight (``drain``, bounded), copies
what the snapshot holds into the staging buffer, laid out as its file (``staging``), and starts its write
(``background``); training goes on.  What became of each save stays with the rank until the ranks
agree (``settle``, a collective every rank calls at the same point): the generations every rank
finished are recorded complete (``complete``), and a save that failed on any rank is reported
once for the job, counted, and the files of it that were written are removed.  So that a
generation whose files are all durable is recorded complete within an iteration or two (not only
at the next save), the extension's trigger polls while a save it made is unsettled
(``PollingTrigger``): every iteration every rank tells the others, in one all-reduce of two
integers, whether its write is still running, and the iteration at which no rank's is, the ranks
settle.  A failure no agreement will see (at the end of the job) is reported by its rank alone
(``report_alone``).  Everything here but ``settle`` and ``poll`` is local to the rank.
"""

import sys
import time
import warnings

import chainer
import numpy
from chainermn_comm import trace, voice

from chainermn_train.checkpoint.ownership.trust import CheckpointWarning
from chainermn_train.checkpoint.read import data_order, generations, lineage, npz
from chainermn_train.checkpoint.reshard import resize
from chainermn_train.checkpoint.write import background, complete, staging, writer
from chainermn_train.checkpoint.write.background import kill_point

__all__ = ['save_sync', 'save_background', 'flight_iteration', 'drain', 'report_alone', 'settle',
           'poll', 'PollingTrigger', 'follow', 'finish', 'completed', 'complete_floor']

def _iteration_of(obj):
    if isinstance(obj, chainer.training.Trainer):
        return int(obj.updater.iteration)
    it = getattr(obj, 'iteration', None)
    if isinstance(it, (int, numpy.integer)) and not isinstance(it, bool):
        return int(it)
    return None


def _iteration(ckpt, obj, iteration):
    """Return the iteration of a save: ``iteration``, else the object's, else one more than the last."""
    if iteration is None:
        iteration = _iteration_of(obj)
    if iteration is None:
        iteration = ckpt._counter + 1
    return int(iteration)


def _meta(ckpt, obj, iteration):
    """Return the metadata this rank's snapshot of ``obj`` at ``iteration`` records."""
    meta = resize.generation_meta(obj, ckpt.comm, iteration)
    meta[lineage.RUN_KEY] = ckpt.run_id
    meta.update(lineage.optimizer_meta(obj))
    meta.update(data_order.meta())
    return meta


def save_sync(ckpt, obj, iteration):
    """Write this rank's snapshot of ``obj`` before returning its file name; raise if it cannot."""
    start = time.monotonic()
    iteration = _iteration(ckpt, obj, iteration)
    ckpt._ensure_ready()
    final = ckpt.filename(iteration)
    meta = _meta(ckpt, obj, iteration)
    size = writer.write_atomically(final, lambda f: npz.write(f, obj, meta))
    generations.remember_meta(final, meta, size)
    ckpt._counter = iteration
    st = ckpt._stats
    st['saves'] += 1
    st['bytes_saved'] += size
    st['last_saved_iteration'] = iteration
    ckpt._saves_since_gc += 1
    if ckpt._saves_since_gc >= ckpt.gc_interval:
        ckpt._saves_since_gc = 0
        ckpt.collect()
    st['save_seconds'] += time.monotonic() - start
    return final


def save_background(ckpt, obj, iteration):
    """Copy the snapshot into the staging buffer and start its write; return the file name.

    A save that cannot be made (the write before it never finished, the directory cannot be
    written) returns None; it is reported at the next agreement (or at the end) and counted.
    """
    start = time.monotonic()
    iteration = _iteration(ckpt, obj, iteration)
    kill_point('before-copy', ckpt.comm.rank)
    if not drain(ckpt):   # the staging buffers are still being written
        ckpt._pending.append(background.Outcome(iteration, error=TimeoutError(
            'the write of iteration {} before it had not finished after {:.0f} s'.format(
                flight_iteration(ckpt), ckpt.write_timeout))))
        return None
    problem = ckpt._readiness_problem()
    if problem is not None:
        ckpt._pending.append(background.Outcome(iteration, error=problem))
        return None
    final = ckpt.filename(iteration)
    meta = _meta(ckpt, obj, iteration)
    meta[complete.BACKGROUND_KEY] = 1
    image = ckpt._staging.stage(staging.capture(obj), meta)
    kill_point('after-copy', ckpt.comm.rank)
    rank = ckpt.comm.rank
    flight = ckpt._flight
    ckpt._counter = iteration
    ckpt._saves_since_gc += 1
    collect = ckpt._saves_since_gc >= ckpt.gc_interval
    if collect:
        ckpt._saves_since_gc = 0

    spare, flight.spare = flight.spare, None

    def write():
        size = writer.write_atomically(
            final, lambda f: image.write_to(flight.file(f), writer.write_aligned), rank, raw=True,
            reuse=spare)
        generations.remember_meta(final, meta, size)   # its collection need not read it back
        if collect:   # here, off the training thread: reading old files' metadata, unlinking
            _collect_after_write(ckpt)
        return size

    flight.start(iteration, write, image.size)
    ckpt._stats['save_seconds'] += time.monotonic() - start
    return final


def _collect_after_write(ckpt):
    """Remove the old generations (on the writer thread, once the new file is durable).

    One file of them is set aside for the next write to write over (``writer.set_aside``).
    """
    flight = ckpt._flight

    def remove(fn):
        if flight.spare is None:
            flight.spare = writer.set_aside(fn, ckpt._tmp_prefix())
            if flight.spare is not None:
                ckpt._stats['files_removed'] += 1
                return
        ckpt._remove(fn)

    try:
        ckpt.collect(remove)
    except OSError as e:   # the directory went away since the check: the next save says so
        warnings.warn('rank {}: could not remove old snapshots of {!r} in {}: {}'.format(
            ckpt.comm.rank, ckpt.name, ckpt.path, e), CheckpointWarning, stacklevel=2)


def flight_iteration(ckpt):
    """Return the iteration of the write in flight (or of the last one started)."""
    return ckpt._flight._iteration


def drain(ckpt, timeout=None):
    """Wait (bounded) for this rank's write in flight and keep its outcome; return whether none is left.

    Not a collective.  The wait is its own trace event (``checkpoint wait``).
    """
    if not ckpt._flight.busy:
        return True
    start = time.monotonic()
    with trace.span('checkpoint wait', 'io'):
        outcome = ckpt._flight.wait(ckpt.write_timeout if timeout is None else timeout)
    ckpt._stats['wait_seconds'] += time.monotonic() - start
    if outcome is None:
        return True
    ckpt._pending.append(outcome)
    if outcome.ok:
        st = ckpt._stats
        st['saves'] += 1
        st['bytes_saved'] += outcome.size
        st['write_seconds'] += outcome.seconds
        st['last_saved_iteration'] = outcome.iteration
    if len(ckpt._pending) > 8:   # saves without agreements between them: say it here
        report_alone(ckpt, ckpt._pending[:-8])
        del ckpt._pending[:-8]
    return outcome.finished


def report_alone(ckpt, outcomes):
    """Report, on this rank only (no agreement comes), the saves among ``outcomes`` that failed."""
    for o in outcomes:
        if not o.ok:
            ckpt._stats['failed_saves'] += 1
            ckpt._stats.setdefault('failed_alone', 0)
            ckpt._stats['failed_alone'] += 1
            warnings.warn('rank {}: the snapshot of iteration {} of {!r} was not written: {}; '
                          'the newest complete generation stays'.format(
                              ckpt.comm.rank, o.iteration, ckpt.name, o.why()),
                          CheckpointWarning, stacklevel=4)


def settle(ckpt):
    """Wait for this rank's write in flight, agree on every rank's, and record complete generations.

    Collective: every rank calls it at the same point (the extension does before each save;
    the preemption handler after its save): an all-reduce of two integers, then, only when some
    rank saved since the last agreement, the gather of every rank's outcomes.  A generation is
    recorded complete when every rank's write of it finished.  A save that failed on any rank is
    reported once for the job (naming the ranks and why), counted, and the files the other ranks
    wrote of it are removed: the newest complete generation stays and the next save tries again.
    """
    ckpt._armed = False   # every rank settles here: nothing is left for the poll
    if not ckpt.background:
        return   # synchronous saves: each was durable (or raised) before save returned
    drain(ckpt)
    if not int(_flags(ckpt, False, bool(ckpt._pending))[1]):
        return None   # no rank saved since the last agreement
    return _agree(ckpt)


def _flags(ckpt, running, unsettled):
    """Return ``[any rank's write running, any rank's save unsettled]`` (collective, two integers).

    An all-reduce, never an object collective: a rank that skipped a collective of the program's
    (e.g. an evaluator called on one rank only) is told so by the guard, not fed another's objects.
    """
    return numpy.asarray(ckpt.comm.allreduce(numpy.array([running, unsettled], numpy.int32),
                                             op='max'))


def _agree(ckpt):
    """Gather every rank's outcomes, record the complete generations, report the failed saves."""
    mine = [(o.iteration, o.ok, o.why()) for o in ckpt._pending]
    ckpt._pending = []
    kill_point('before-agreement', ckpt.comm.rank)
    views = ckpt.comm.allgather_obj(mine)
    reports = {}
    for r, outcomes in enumerate(views):
        for it, ok, why in outcomes:
            reports.setdefault(it, {})[r] = (ok, why)
    failed = sorted(it for it, rs in reports.items() if any(not ok for ok, _ in rs.values()))
    done = sorted(it for it, rs in reports.items()
                  if it not in failed and len(rs) == ckpt.comm.size)
    for it in failed:
        ckpt._stats['failed_saves'] += 1
        if reports[it].get(ckpt.comm.rank, (False,))[0]:
            ckpt._remove(ckpt.filename(it))   # an incomplete generation is not kept
    if done:
        ckpt._committed.update(done)
        kill_point('before-record', ckpt.comm.rank)
        _write_record(ckpt)
        kill_point('after-record', ckpt.comm.rank)
    if failed:
        newest = max(ckpt._committed) if ckpt._committed else None
        voice.warn_all('chainermn checkpoint {!r}: {}; the files of it that were written are '
                       'removed, the newest complete generation ({}) stays, training goes on and '
                       'the next save tries again'.format(
                           ckpt.name, '; '.join('the save of iteration {} failed on rank(s) {}'
                                                .format(it, ', '.join(
                                                    '{} ({})'.format(r, why) for r, (ok, why)
                                                    in sorted(reports[it].items()) if not ok))
                                                for it in failed),
                           'iteration {}'.format(newest) if newest is not None else 'none yet'),
                       CheckpointWarning, ckpt.comm.rank, stacklevel=3)
    return done[-1] if done else None


def poll(ckpt):
    """Settle once no rank's write is still running; return whether nothing is left unsettled.

    Collective and cheap (one all-reduce of two integers, no wait for a write): every rank calls
    it at the same point, e.g. every iteration while a save is unsettled.  When some rank's write
    is still running it returns False at once on every rank; otherwise the ranks settle (when any
    has a save to agree on) and it returns True.
    """
    if not ckpt.background:
        return True
    start = time.perf_counter()
    flight = ckpt._flight
    running = flight.running
    unsettled = flight.busy or bool(ckpt._pending)
    if flight.busy and not running:
        kill_point('before-poll', ckpt.comm.rank)   # this rank's write is durable; not yet told
    flags = _flags(ckpt, running, unsettled)
    st = ckpt._stats
    st['polls'] += 1
    st['poll_seconds'] += time.perf_counter() - start
    if int(flags[0]):
        return False
    ckpt._armed = False
    if int(flags[1]):
        drain(ckpt)   # no rank's write runs (the flags say so): its outcome is collected at once
        _agree(ckpt)
    return True


class PollingTrigger:
    """The checkpointer extension's trigger, which also polls (``poll``) while a save of it is unsettled.

    It fires exactly when the trigger it wraps fires (then the extension settles and saves) and
    forwards every other attribute to it (``serialize`` among them: snapshots hold the same state).
    """

    def __init__(self, trigger, ckpt):
        self.wrapped = trigger
        self._ckpt = ckpt

    def __call__(self, trainer):
        if self.wrapped(trainer):
            return True
        if self._ckpt._armed:   # set on every rank by the extension's save, cleared by settle
            poll(self._ckpt)
        return False

    def __getattr__(self, name):
        if name in ('wrapped', '_ckpt'):
            raise AttributeError(name)
        return getattr(self.wrapped, name)


def follow(ckpt, trainer):
    """Make the trigger of ``ckpt``'s entry in ``trainer`` a :class:`PollingTrigger` (background: once)."""
    if not ckpt.background:
        return
    for entry in trainer._extensions.values():
        if entry.extension is ckpt and not isinstance(entry.trigger, PollingTrigger):
            entry.trigger = PollingTrigger(entry.trigger, ckpt)


def _write_record(ckpt):
    """Record this rank's files of the complete generations (a warning when it cannot)."""
    try:
        mine = set(ckpt.local_iterations())
        complete.write_record(ckpt.path, ckpt.name, ckpt.comm.rank, ckpt.run_id,
                              sorted(ckpt._committed & mine))
    except OSError as e:
        warnings.warn('rank {}: could not record the complete generations of {!r} in {}: {}; '
                      'they still load while every rank\'s file of them is on disk'.format(
                          ckpt.comm.rank, ckpt.name, ckpt.path, e), CheckpointWarning, stacklevel=4)


def complete_floor(ckpt, files, meta_of):
    """Return the newest iteration known complete, or -1.

    Known complete: agreed on (recorded), or written synchronously with every rank's file seen.
    A background generation every rank's file of which is on disk but that was not agreed on yet
    does not count: a rank may have stopped before telling the others, and its disk may be lost.
    """
    size = ckpt.comm.size
    by_it = {}
    for r, it in files:
        by_it.setdefault(it, set()).add(r)
    seen = [it for it, ranks in by_it.items() if all(r in ranks for r in range(size)) and all(
        isinstance(meta_of(it, r), dict) and meta_of(it, r).get('world_size') == size
        and not meta_of(it, r).get(complete.BACKGROUND_KEY) for r in range(size))]
    return max(list(ckpt._committed) + seen + [-1])


def completed(ckpt):
    """Return whether the run ended as planned: no error, and the trainer's stop reached (if any)."""
    if ckpt._failed or sys.exc_info()[0] is not None:
        return False
    trainer = ckpt._trainer
    if trainer is None:
        return True
    length = getattr(trainer.stop_trigger, 'get_training_length', None)
    if length is None:
        return True
    period, unit = length()
    if unit == 'iteration':
        return trainer.updater.iteration >= period
    return trainer.updater.epoch_detail >= period


def finish(ckpt):
    """At the end (not a collective): wait for the write in flight and report what never was agreed."""
    drain(ckpt)
    spare, ckpt._flight.spare = ckpt._flight.spare, None
    if spare is not None:
        writer.remove_file(spare)
    report_alone(ckpt, ckpt._pending)
    ckpt._pending = []
    failed = ckpt._stats['failed_saves'] - ckpt._stats.get('failed_alone', 0)
    if failed and ckpt.comm.rank == 0:   # agreed: the same count on every rank
        warnings.warn('chainermn checkpoint {!r}: {} save(s) of the job failed (each was reported '
                      'when it failed)'.format(ckpt.name, failed), CheckpointWarning, stacklevel=3)
    if ckpt._flight.busy:
        warnings.warn('rank {}: the snapshot write of iteration {} of {!r} had not finished after '
                      '{:.0f} s; that generation is incomplete and will not be loaded'.format(
                          ckpt.comm.rank, flight_iteration(ckpt), ckpt.name, ckpt.write_timeout),
                      CheckpointWarning, stacklevel=3)
