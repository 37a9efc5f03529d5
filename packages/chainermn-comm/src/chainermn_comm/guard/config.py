"""What a call guard does, from its arguments and the environment (read through :mod:`settings`)."""

import collections

from chainermn_comm import settings
from chainermn_comm.protocol import (CHECK_ENV, DEBUG_ENV, EXIT_NOTICE_ENV, STALL_SECONDS_ENV,
                                     TIMEOUT_ENV, UNRESPONSIVE_SECONDS_ENV, VARIABLES)

__all__ = ['GuardConfig', 'resolve_timeout', 'resolve_stall_seconds', 'resolve_unresponsive_seconds',
           'exit_notice_enabled', 'debug_enabled', 'check_enabled', 'DEFAULT_TIMEOUT',
           'DEFAULT_STALL_SECONDS', 'DEFAULT_UNRESPONSIVE_SECONDS']

#: Default watchdog timeout in seconds (30 minutes).
DEFAULT_TIMEOUT = VARIABLES[TIMEOUT_ENV].default
#: Default stall report threshold in seconds.
DEFAULT_STALL_SECONDS = VARIABLES[STALL_SECONDS_ENV].default
#: Default time a rank may leave the stall inspector's queries unanswered (4 minutes: with the
#: 60 s stall threshold a frozen rank ends the job about 5 minutes after the others began to wait).
DEFAULT_UNRESPONSIVE_SECONDS = VARIABLES[UNRESPONSIVE_SECONDS_ENV].default


def resolve_timeout(timeout):
    """Return the watchdog timeout in seconds: argument, else $CHAINERMN_TIMEOUT, else default; 0 is off."""
    if timeout is None:
        return float(settings.read(TIMEOUT_ENV))
    value = float(timeout)
    if not settings.in_bounds(VARIABLES[TIMEOUT_ENV], value):
        raise ValueError('timeout={!r} is out of range: give 0 (the watchdog off) or at least {:g} '
                         'seconds, like ${} (a shorter one would end jobs whose calls are only '
                         'slow)'.format(timeout, VARIABLES[TIMEOUT_ENV].minimum, TIMEOUT_ENV))
    return value


def resolve_stall_seconds():
    """Return the stall report threshold: $CHAINERMN_STALL_SECONDS, else 60; 0 is off."""
    return float(settings.read(STALL_SECONDS_ENV))


def resolve_unresponsive_seconds():
    """Return how long a rank may leave progress queries unanswered: $CHAINERMN_UNRESPONSIVE_SECONDS, else 240; 0 is off."""
    return float(settings.read(UNRESPONSIVE_SECONDS_ENV))


def exit_notice_enabled():
    """Return True unless $CHAINERMN_EXIT_NOTICE=0 turns off the notice a rank sends as it ends."""
    return settings.read(EXIT_NOTICE_ENV)


def debug_enabled():
    """Return True when $CHAINERMN_DEBUG asks for the full cross-rank consistency checks."""
    return settings.read(DEBUG_ENV)


def check_enabled():
    """Return True unless $CHAINERMN_CHECK=0 turns off the default-mode agreement check."""
    return settings.read(CHECK_ENV)


class GuardConfig(collections.namedtuple('GuardConfig', 'timeout stall_seconds debug check '
                                                        'unresponsive_seconds exit_notice')):
    """The watchdog timeout, the stall threshold (seconds, 0: off) and the agreement check mode.

    ``debug``: gather every rank's full signature at each collective; ``check``: the default
    mode's fingerprint exchange (off with one rank, or in debug mode); ``unresponsive_seconds``:
    how long a rank may leave the stall inspector's queries unanswered before it is declared
    gone (0: never); ``exit_notice``: whether this rank tells the others when it ends.
    """

    __slots__ = ()

    @classmethod
    def resolve(cls, size, timeout=None, debug=None, check=None):
        """Return the configuration of a guard on ``size`` ranks; None arguments come from the environment."""
        debug = debug_enabled() if debug is None else bool(debug)
        check = (check_enabled() if check is None else bool(check)) and not debug and size > 1
        return cls(resolve_timeout(timeout), resolve_stall_seconds(), debug, check,
                   resolve_unresponsive_seconds(), exit_notice_enabled() and size > 1)
