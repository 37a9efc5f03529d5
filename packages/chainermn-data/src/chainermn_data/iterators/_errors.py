"""Error raised on every rank when ranks use their iterators differently."""

__all__ = ['IteratorMismatchError']


class IteratorMismatchError(RuntimeError):
    """Ranks disagree on how an iterator is created or used (raised on every rank that can tell)."""
