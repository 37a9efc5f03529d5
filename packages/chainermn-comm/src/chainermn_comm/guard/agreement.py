"""The agreement check: do all ranks enter the same collective call with the same arguments?

Default mode (``$CHAINERMN_CHECK`` unset or 1): entering a collective exchanges a 62-bit
fingerprint ``fp`` of ``(name, key or sig)``.  On communicators of up to ``GATHER_MAX_RANKS``
ranks every rank all-gathers a fixed 88-byte record, ``fp`` plus up to ``PAYLOAD_BYTES`` of the
call's own data plus one word a caller may set for the next call (:meth:`Agreement.mark`: e.g.
the multi-node optimizer's finite check) plus one word for live straggler detection
(:mod:`.straggler`: microseconds since the rank left its previous collective): a small
all-reduce hands its array in
(``payload=``), finds every rank's array in the check's result and reduces them locally in rank
order, so it costs one message, not two.
On larger communicators it all-reduces ``[fp, -fp]`` with ``MPI.MAX``.  Either way every rank
learns whether all agree.  Only when they do not, the ranks gather their full signatures and
raise :class:`CommunicationError` naming the ranks, hosts and the first difference.

Debug mode (``$CHAINERMN_DEBUG=1``): the full signatures are gathered at every collective instead.
"""

import array
import operator
import zlib

from chainermn_comm import voice
from chainermn_comm._errors import CommunicationError
from chainermn_comm.guard import straggler
from chainermn_comm.guard.report import INVALID_INPUT, disagreement_message, resolve

__all__ = ['Agreement', 'stable_code', 'stable_key', 'comparable', 'GATHER_MAX_RANKS',
           'PAYLOAD_BYTES']

_FP_MASK = (1 << 62) - 1
#: Largest communicator whose check all-gathers a record (fingerprint + small payload).
GATHER_MAX_RANKS = 64
#: Bytes of a call's data that ride in the check's record.
PAYLOAD_BYTES = 64
#: Record words: the fingerprint, the payload, the mark word, the arrival word (last).
_REC_WORDS = 1 + PAYLOAD_BYTES // 8 + 1 + 1

_codes = {}


def stable_code(value):
    """Return a process-independent int for ``value`` (a str, or anything with a stable ``str``)."""
    try:
        code = _codes.get(value)
    except TypeError:  # unhashable
        return zlib.crc32(str(value).encode('utf-8', 'replace'))
    if code is None:
        code = _codes[value] = zlib.crc32(str(value).encode('utf-8', 'replace'))
    return code


def stable_key(value):
    """Turn a signature into ints and tuples, whose ``hash`` is the same in every process."""
    if isinstance(value, (tuple, list)):
        return tuple(stable_key(v) for v in value)
    if isinstance(value, float):
        return stable_code(repr(value))
    try:
        return operator.index(value)  # int, bool, numpy integers
    except TypeError:
        return stable_code(value)


def comparable(sig):
    """Return ``sig`` as the ranks compare it: all 'invalid input' signatures are alike.

    When every rank's input is invalid, each raises its own error after the check.
    """
    if sig and sig[0][0] == INVALID_INPUT:
        return ((INVALID_INPUT, ''),)
    return sig


class _Records:
    """Buffers of the all-gathered check: my record and every rank's, with views of the payloads."""

    def __init__(self, size):
        import numpy
        self.size = size
        self.mine = numpy.zeros(_REC_WORDS, numpy.int64)
        self.mine_bytes = self.mine.view(numpy.uint8)
        self.all = numpy.zeros((size, _REC_WORDS), numpy.int64)
        self.all_fp = self.all[:, 0]
        self.all_since = self.all[:, -1]
        self.all_marks = self.all[:, -2]
        self.all_bytes = self.all.view(numpy.uint8)
        self._views = {}  # (dtype, shape) -> (view of my record, views of every rank's record)

    def payload_views(self, payload):
        key = (payload.dtype, payload.shape)
        views = self._views.get(key)
        if views is None:
            n = payload.nbytes
            mine = self.mine_bytes[8:8 + n].view(payload.dtype).reshape(payload.shape)
            rows = [self.all_bytes[r, 8:8 + n].view(payload.dtype).reshape(payload.shape)
                    for r in range(self.size)]
            views = self._views[key] = (mine, rows)
            if len(self._views) > 64:
                self._views.clear()
                self._views[key] = views
        return views


class Agreement:
    """Check, at each collective call, that every rank of ``mpi_comm`` makes the same call.

    ``check``: the default mode's fingerprint exchange; ``debug``: gather full signatures over
    a duplicate of ``mpi_comm`` (:attr:`debug_comm`).  :attr:`in_check` is true while a check
    runs (the watchdog says so); :attr:`desynced` once the ranks were found out of step.
    """

    def __init__(self, mpi_comm, rank, size, host, check, debug, hosts=None, world_of=None):
        from mpi4py import MPI
        self.mpi_comm = mpi_comm
        self.world_of = world_of
        self.rank = rank
        self.size = size
        self.host = host
        self.check = check
        self.in_check = False
        self.desynced = False
        self.debug_comm = mpi_comm.Dup() if debug else None
        self._records = _Records(size) if check and size <= GATHER_MAX_RANKS else None
        #: Whether the records carry arrival words (live straggler detection, every rank).
        self.arrivals = self._records is not None and straggler.enabled()
        #: Rank 0's straggler detector (None elsewhere, or when detection is off).
        self.detector = None
        if self.arrivals:
            # Rank 0 names hosts: the topology's, or one gather of them at creation.
            hosts = list(hosts) if hosts is not None else mpi_comm.allgather(host)
            if rank == 0:
                self.detector = straggler.Detector(hosts, world_of)
        #: On the rank that reports the errors every rank raises here (rank 0): (collective
        #: number, error) of the last one, until it is printed (see :mod:`.departure`).
        self.unreported = None
        #: Whether this rank set a mark for the next gathered check; every rank's marks after it.
        self.marked = False
        self.marks = None
        # array.array: item access costs a fraction of NumPy's on this per-call path.
        self._header = array.array('q', [0, 0])
        self._max = MPI.MAX
        self._in_place = MPI.IN_PLACE

    def mark(self, word):
        """Let ``word`` (an int) ride on the next collective's check; False when no record carries it.

        Every rank's word is then in :attr:`marks` (a list in rank order; 0 from a rank that set
        none) until the next marked call.
        """
        if self._records is None or not self.check:
            return False
        self._records.mine[-2] = int(word)
        self.marked = True
        self.marks = None
        return True

    @property
    def active(self):
        """Whether collective calls are checked at all."""
        return self.check or self.debug_comm is not None

    def run(self, cur, key, payload, collective_seq, since=-1):
        """Check call ``cur``; return every rank's payload (rows in rank order) when it was gathered.

        ``since``: microseconds since this rank left its previous collective (-1: none yet).
        """
        self.in_check = True
        try:
            if self.check:
                return self._check_fingerprint(cur, key, payload, collective_seq, since)
            self._check_signatures(cur, collective_seq)
            return None
        finally:
            self.in_check = False

    # -- default mode: one small exchange -----------------------------------------------------
    def _check_fingerprint(self, cur, key, payload, collective_seq, since):
        if key is None:
            key = stable_key(comparable(resolve(cur.sig)))
        fp = hash((stable_code(cur.name), key)) & _FP_MASK
        if self._records is not None:
            return self._check_gathered(cur, fp, payload, collective_seq, since)
        h = self._header
        h[0] = fp
        h[1] = -fp
        self.mpi_comm.Allreduce(self._in_place, h, self._max)
        if h[0] != fp or h[1] != -fp:
            self._raise_from(self._gather_calls(cur, self.mpi_comm, collective_seq),
                             'the next collective call')
        return None

    def _check_gathered(self, cur, fp, payload, collective_seq, since):
        """All-gather ``[fp, payload, since]`` records; return the payloads when every ``fp`` agrees."""
        rec = self._records
        rec.mine[0] = fp
        rec.mine[-1] = since
        views = None
        if payload is not None and payload.nbytes <= PAYLOAD_BYTES:
            views = rec.payload_views(payload)
            views[0][...] = payload
        self.mpi_comm.Allgather(rec.mine, rec.all)
        if self.marked:
            self.marked = False
            rec.mine[-2] = 0
            self.marks = rec.all_marks.tolist()
        if rec.all_fp.tolist().count(fp) != self.size:
            self._raise_from(self._gather_calls(cur, self.mpi_comm, collective_seq),
                             'the next collective call')
        if self.detector is not None and cur.name in straggler.GRAD_CALLS:
            self.detector.observe(rec.all_since.tolist(), cur.start)
        return None if views is None else views[1]

    # -- debug mode: gather every signature ---------------------------------------------------
    def _check_signatures(self, cur, collective_seq):
        everyone = self._gather_calls(cur, self.debug_comm, collective_seq)
        first = (everyone[0][0], comparable(everyone[0][1]))
        if all((e[0], comparable(e[1])) == first for e in everyone):
            return
        # Every rank sees the same mismatch: the ranks are out of step on this communicator,
        # so the check at program exit must not wait for a partner.
        self.desynced = True
        self._raise_from(everyone, 'the next collective call (CHAINERMN_DEBUG=1)')

    def _gather_calls(self, cur, comm, collective_seq):
        name, sig = cur.name, cur.sig
        return comm.allgather((name, tuple(resolve(sig)), collective_seq, self.host))

    def _raise_from(self, everyone, what):
        # Every rank raises it, with the same table: rank 0 reports it (chainermn_comm.voice).
        error = voice.agreed(CommunicationError(disagreement_message(self.rank, what, everyone,
                                                                     self.world_of)), self.mpi_comm)
        if self.rank == 0:  # printed later if this rank catches it and the others end with it
            self.unreported = (everyone[self.rank][2], error)
        raise error
