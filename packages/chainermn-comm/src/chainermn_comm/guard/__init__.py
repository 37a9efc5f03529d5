"""The guard around every blocking call of a communicator: agreement check, stall inspector, watchdog.

- :mod:`.config`: timeout, stall threshold and check mode, from arguments and ``CHAINERMN_*``;
- :mod:`.agreement`: do all ranks make the same collective call (fingerprints, or full
  signatures in debug mode)?  :mod:`.exit_check`: the debug mode's last check at program exit;
- :mod:`.watchdog` and :mod:`.side_channel`: report stalled calls, declare frozen ranks gone,
  abort hung jobs; :mod:`.departure` and :mod:`.exit_status`: the notice a rank sends as it ends,
  and what a rank waiting for it does;
- :mod:`.report`: the texts;
- :mod:`.call`: :class:`CallGuard`, which ties them together per communicator.
"""

import contextlib

from chainermn_comm.guard.agreement import GATHER_MAX_RANKS, PAYLOAD_BYTES, stable_code
from chainermn_comm.guard.call import CallGuard
from chainermn_comm.guard.config import (DEFAULT_STALL_SECONDS, DEFAULT_TIMEOUT, check_enabled,
                                         debug_enabled, resolve_stall_seconds, resolve_timeout)
from chainermn_comm.guard.report import EXIT_CALL, INVALID_INPUT
from chainermn_comm.protocol import WATCHDOG_EXIT_STATUS

__all__ = ['CallGuard', 'fail_together', 'guarded_call', 'stable_code', 'resolve_timeout',
           'resolve_stall_seconds', 'debug_enabled', 'check_enabled', 'DEFAULT_TIMEOUT',
           'DEFAULT_STALL_SECONDS', 'WATCHDOG_EXIT_STATUS', 'EXIT_CALL', 'INVALID_INPUT',
           'GATHER_MAX_RANKS', 'PAYLOAD_BYTES']


def fail_together(comm, name, error):
    """Raise ``error`` here and a CommunicationError on the ranks that are in collective ``name``.

    For a rank that finds its own input invalid where the other ranks enter a collective call:
    it joins the agreement check with an 'invalid input' signature instead, so that no rank is
    left waiting.  Without the check (one rank, $CHAINERMN_CHECK=0) it just raises ``error``.
    """
    guard = getattr(comm, 'guard', None)
    if not isinstance(guard, CallGuard) or not (guard.check or guard.debug):
        raise error
    with guard(name, problem=error):
        pass
    raise error  # not reached: entering the guard raises ``error``


def guarded_call(comm, name, sig=(), key=None):
    """Return the guard of blocking call ``name`` on ChainerMN communicator ``comm`` (agreement
    check, stall report, watchdog), or a context that does nothing for any other ``comm`` (e.g.
    an mpi4py communicator)."""
    guard = getattr(comm, 'guard', None)
    if guard is None or not callable(guard):
        return contextlib.nullcontext()
    return guard(name, sig, key=key)
