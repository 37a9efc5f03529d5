"""Multi-node iterator: the master rank draws every batch and every rank receives the same one."""

import chainer
from chainer.serializer import Deserializer
from chainermn_comm import voice

from chainermn_data._comm import describe, guarded, mpi_comm_of
from chainermn_data.iterators import _records
from chainermn_data.iterators._errors import IteratorMismatchError

__all__ = ['MultiNodeIterator', 'create_multi_node_iterator']

_STATE_ATTRS = ('epoch', 'is_new_epoch', 'epoch_detail', 'previous_epoch_detail', 'current_position')


def _state_of(it):
    return {name: getattr(it, name, None) for name in _STATE_ATTRS + ('batch_size', 'repeat')}


class MultiNodeIterator(chainer.dataset.Iterator):
    """Iterator whose master draws batches from ``actual_iterator`` and shares them with every rank.

    Every rank must call ``next``, ``reset`` and ``serialize`` together and in the same order
    (they are collective); a disagreement that reaches the iterator's exchange raises
    :class:`IteratorMismatchError` on every rank.  ``finalize`` is local.
    """

    def __init__(self, actual_iterator, communicator, rank_master=0):
        from mpi4py.util import pkl5
        mpi = mpi_comm_of(communicator)
        self._communicator = communicator
        self.rank = mpi.Get_rank()
        self.size = mpi.Get_size()
        self.rank_master = rank_master
        self.actual_iterator = actual_iterator
        problem = None
        if isinstance(rank_master, bool) or not isinstance(rank_master, int) or \
                not 0 <= rank_master < self.size:
            problem = 'rank_master must be an int rank in [0, {}); got {!r}'.format(self.size, rank_master)
        elif self.rank == rank_master and (actual_iterator is None or not hasattr(actual_iterator, '__next__')):
            problem = 'the master rank needs an iterator (e.g. SerialIterator); got {}'.format(
                describe(actual_iterator))
        elif self.rank == rank_master and getattr(actual_iterator, 'dataset', 0) is None:
            problem = ('the master rank\'s {} iterates over dataset=None: the master draws every batch '
                       'from its own data set, so load the data set on rank_master={} (the other ranks '
                       'pass None as their iterator)'.format(describe(actual_iterator), rank_master))
        mine = ('create_multi_node_iterator', repr(rank_master), problem,
                _state_of(actual_iterator) if problem is None and self.rank == rank_master else None)
        with guarded(communicator, 'create_multi_node_iterator'):
            self._work = mpi.Dup()
            everyone = self._work.allgather(mine)
        bad = [(r, e[2]) for r, e in enumerate(everyone) if e[2] is not None]
        if bad:
            raise voice.agreed(ValueError(
                'rank {}: create_multi_node_iterator got invalid arguments: {}'.format(
                    self.rank, '; '.join('rank {}: {}'.format(r, p) for r, p in bad))), mpi)
        _require_same_calls(
            mpi, everyone, self.rank, 'while creating a multi-node iterator', '{}(rank_master={})',
            'Every rank must call create_multi_node_iterator(..., rank_master=M) together with the same M.')
        self._pkl = pkl5.Intracomm(self._work)
        self._seq = 0
        self._state = everyone[rank_master][3]

    @property
    def is_master(self):
        return self.rank == self.rank_master

    # -- the one exchange every collective method goes through -----------------------------
    def _exchange(self, op, payload=None):
        """Share the master's ``payload`` with every rank after checking all ranks run ``op``."""
        self._seq += 1
        mine = (op, self._seq, payload if self.is_master else None)
        # One guard name for next/reset/serialize: the exchange below names a mismatch between them.
        with guarded(self._communicator, 'multi_node_iterator'):
            everyone = self._pkl.allgather(mine)
        _require_same_calls(
            self._work, everyone, self.rank, 'on the multi-node iterator call', '{} (call #{})',
            'Every rank must call next/reset/serialize of its multi-node iterator together and in the '
            'same order.')
        return everyone[self.rank_master][2]

    def _master_run(self, fn):
        """Run ``fn`` on the master; return ('ok', result) or ('error', message, exception)."""
        if not self.is_master:
            return None, None
        try:
            return ('ok', fn()), None
        except StopIteration:
            return ('stop',), None
        except Exception as e:
            return ('error', '{}: {}'.format(type(e).__name__, e)), e

    def _finish(self, op, outcome, exc):
        """Exchange the master's outcome; raise on every rank if the master failed."""
        shared = self._exchange(op, (outcome, _state_of(self.actual_iterator)) if self.is_master else None)
        outcome, self._state = shared
        if outcome[0] == 'error':
            if exc is not None:
                raise exc
            raise RuntimeError('rank {}: multi-node iterator: {} failed on the master rank {}: {}'.format(
                self.rank, op, self.rank_master, outcome[1]))
        return outcome

    # -- iterator protocol ----------------------------------------------------------------
    def __next__(self):
        outcome, exc = self._master_run(lambda: self.actual_iterator.__next__())
        outcome = self._finish('next', outcome, exc)
        if outcome[0] == 'stop':
            raise StopIteration
        return outcome[1]

    next = __next__

    def __iter__(self):
        return self

    def reset(self):
        """Reset the master's iterator (collective)."""
        outcome, exc = self._master_run(lambda: self.actual_iterator.reset())
        self._finish('reset', outcome, exc)

    def serialize(self, serializer):
        """Save the master's state on every rank, or load it on the master and share it (collective)."""
        if isinstance(serializer, Deserializer):
            outcome, exc = self._master_run(lambda: self.actual_iterator.serialize(serializer))
            self._finish('load', outcome, exc)
            return
        outcome, exc = self._master_run(lambda: _records.record(self.actual_iterator))
        outcome = self._finish('save', outcome, exc)
        _records.replay(outcome[1], serializer)

    def finalize(self):
        """Finalize the wrapped iterator of this rank (local, not collective)."""
        fin = getattr(self.actual_iterator, 'finalize', None)
        if fin is not None:
            fin()

    # -- state shared from the master -----------------------------------------------------------
    epoch = property(lambda self: self._state['epoch'])
    is_new_epoch = property(lambda self: self._state['is_new_epoch'])
    epoch_detail = property(lambda self: self._state['epoch_detail'])
    previous_epoch_detail = property(lambda self: self._state['previous_epoch_detail'])
    current_position = property(lambda self: self._state['current_position'])
    batch_size = property(lambda self: self._state['batch_size'])
    repeat = property(lambda self: self._state['repeat'])


def create_multi_node_iterator(actual_iterator, communicator, rank_master=0):
    """Wrap ``actual_iterator`` so that rank ``rank_master`` draws batches and every rank gets them.

    Collective: every rank of ``communicator`` calls it together with the same ``rank_master``;
    ranks other than the master may pass ``None``.  Batches are pickled, so they may hold arrays of
    any dtype, tuples and dicts (unpickling them is safe: only the master rank of this MPI job
    sends them).  ``epoch``, ``is_new_epoch``, ``epoch_detail``,
    ``previous_epoch_detail`` and ``StopIteration`` are the master's on every rank.
    """
    return MultiNodeIterator(actual_iterator, communicator, rank_master)


def _require_same_calls(mpi, everyone, rank, where, call_fmt, rule):
    """Raise IteratorMismatchError unless every rank's (call, detail) pair in ``everyone`` is the same.

    Every rank of ``mpi`` raises it together: its rank 0 reports it (:mod:`chainermn_comm.voice`).
    """
    calls = [e[:2] for e in everyone]
    if any(c != calls[0] for c in calls):
        raise voice.agreed(IteratorMismatchError('rank {}: ranks disagree {}: {}. {}'.format(
            rank, where, '; '.join('rank {}: {}'.format(r, call_fmt.format(*c)) for r, c in enumerate(calls)),
            rule)), mpi)
