"""What a call guard does, from its arguments and the environment (read through :mod:`settings`)."""

import collections

from chainermn_comm import settings
from chainermn_comm.protocol import CHECK_ENV, DEBUG_ENV, STALL_SECONDS_ENV, TIMEOUT_ENV, VARIABLES

__all__ = ['GuardConfig', 'resolve_timeout', 'resolve_stall_seconds', 'debug_enabled',
           'check_enabled', 'DEFAULT_TIMEOUT', 'DEFAULT_STALL_SECONDS']

#: Default watchdog timeout in seconds (30 minutes).
DEFAULT_TIMEOUT = VARIABLES[TIMEOUT_ENV].default
#: Default stall report threshold in seconds.
DEFAULT_STALL_SECONDS = VARIABLES[STALL_SECONDS_ENV].default


def resolve_timeout(timeout):
    """Return the watchdog timeout in seconds: argument, else $CHAINERMN_TIMEOUT, else default; 0 is off."""
    if timeout is None:
        timeout = settings.read(TIMEOUT_ENV)
    timeout = float(timeout)
    if not timeout >= 0:
        raise ValueError('timeout must be >= 0 seconds (0 turns the watchdog off); got {}'.format(timeout))
    return timeout


def resolve_stall_seconds():
    """Return the stall report threshold: $CHAINERMN_STALL_SECONDS, else 60; 0 is off."""
    return float(settings.read(STALL_SECONDS_ENV))


def debug_enabled():
    """Return True when $CHAINERMN_DEBUG asks for the full cross-rank consistency checks."""
    return settings.read(DEBUG_ENV)


def check_enabled():
    """Return True unless $CHAINERMN_CHECK=0 turns off the default-mode agreement check."""
    return settings.read(CHECK_ENV)


class GuardConfig(collections.namedtuple('GuardConfig', 'timeout stall_seconds debug check')):
    """The watchdog timeout, the stall threshold (seconds, 0: off) and the agreement check mode.

    ``debug``: gather every rank's full signature at each collective; ``check``: the default
    mode's fingerprint exchange (off with one rank, or in debug mode).
    """

    __slots__ = ()

    @classmethod
    def resolve(cls, size, timeout=None, debug=None, check=None):
        """Return the configuration of a guard on ``size`` ranks; None arguments come from the environment."""
        debug = debug_enabled() if debug is None else bool(debug)
        check = (check_enabled() if check is None else bool(check)) and not debug and size > 1
        return cls(resolve_timeout(timeout), resolve_stall_seconds(), debug, check)
