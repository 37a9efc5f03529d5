"""Exceptions raised by chainermn communicators."""

__all__ = ['CommunicatorUnavailableError', 'CommunicationError']


class CommunicatorUnavailableError(RuntimeError):
    """Raised when a communicator needs software or hardware this machine lacks."""


class CommunicationError(RuntimeError):
    """Raised on every rank when ranks disagree about a communication call."""
