"""Live straggler detection: rank 0 names a rank that keeps arriving late at the gradient all-reduce.

It costs no message of its own.  The agreement check's all-gathered record carries one more
int64 word per rank: the microseconds since that rank left its previous collective on the
communicator (-1 before its first).  At each gradient all-reduce rank 0 takes every rank's
lateness as its word minus the median word.  When the latest rank is late by at least
``SHARE`` of the iteration time (rank 0's time between two gradient all-reduces), the update
counts against it.  A rank counted at more than half of the last ``WINDOW`` updates is named
once, through the ``chainermn.straggler`` logger, as::

    chainermn: straggler: rank R (host H) arrives X ms after the median at N of the last M updates

(X: the median lateness of those N updates).  ``CHAINERMN_STRAGGLER=0`` turns it off.  It needs
the gathered check: communicators of at most ``GATHER_MAX_RANKS`` ranks with the default check.
"""

import collections

from chainermn_comm import settings
from chainermn_comm import trace
from chainermn_comm.voice import who
from chainermn_comm.log import get_logger
from chainermn_comm.protocol import STRAGGLER_ENV

__all__ = ['Detector', 'GRAD_CALLS', 'WINDOW', 'SHARE', 'enabled', 'format_line']

#: Updates looked back on.
WINDOW = 50
#: Lateness, as a share of the iteration time, that counts an update against the latest rank.
SHARE = 0.2
#: The collectives of a gradient all-reduce (plain, overlapped, double-buffered).
GRAD_CALLS = frozenset(['allreduce_grad', 'multi_node_mean_grad', 'multi_node_mean_grad(overlap)',
                        'multi_node_mean_grad(double_buffering)'])

_log = get_logger('straggler')


def enabled():
    """Return False when ``CHAINERMN_STRAGGLER=0`` turns live detection off."""
    return settings.read(STRAGGLER_ENV)


def format_line(rank, host, late_ms, count, window, world_of=None):
    """Return the line that names a straggler (``world_of``: see :func:`.report.world`)."""
    return ('chainermn: straggler: {} arrives {:.1f} ms after the median at {} of '
            'the last {} updates'.format(who(rank, host, world_of), late_ms, count, window))


class Detector:
    """Rank 0's view of the arrivals at gradient all-reduces; names each straggler once."""

    def __init__(self, hosts, world_of=None):
        self.hosts = list(hosts)
        self.world_of = world_of
        #: One entry per update: (latest rank, its lateness in us) when it counted, else None.
        self.window = collections.deque(maxlen=WINDOW)
        self.named = set()
        self._previous = None  # rank 0's arrival (time.monotonic) at the last gradient all-reduce

    def observe(self, words, arrived):
        """Take one gradient all-reduce: every rank's word (a sequence of ints) and rank 0's arrival."""
        previous, self._previous = self._previous, arrived
        if previous is None:
            return None
        words = list(words)
        if min(words) < 0:
            return None  # some rank had no collective before this one
        ordered = sorted(words)
        n = len(ordered)
        median = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2.0
        latest = max(range(n), key=words.__getitem__)
        late_us = words[latest] - median
        period_us = (arrived - previous) * 1e6
        counted = late_us > 0 and late_us >= SHARE * period_us
        self.window.append((latest, late_us) if counted else None)
        if not counted or latest in self.named:
            return None
        lates = sorted(e[1] for e in self.window if e is not None and e[0] == latest)
        if 2 * len(lates) <= WINDOW:
            return None
        self.named.add(latest)
        return self._name(latest, lates)

    def _name(self, rank, lates):
        k = len(lates)
        late_ms = (lates[k // 2] if k % 2 else (lates[k // 2 - 1] + lates[k // 2]) / 2.0) / 1e3
        host = self.hosts[rank] if rank < len(self.hosts) else '?'
        line = format_line(rank, host, late_ms, k, len(self.window), self.world_of)
        # The default handler prints the line as it is (no rank/host prefix: it names another
        # rank); a handler of the user's gets it as the record's message.
        _log.warning('%s', line, extra={'chainermn_plain': True})
        if trace.ON:
            trace.instant('straggler', 'straggler', {'rank': rank, 'host': host, 'late_ms': late_ms,
                                                     'count': k, 'window': len(self.window)})
        return line
