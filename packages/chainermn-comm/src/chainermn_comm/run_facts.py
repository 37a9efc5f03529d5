"""Facts of this process's run that a checkpoint records and a resumed run compares (a registry).

The sibling packages meet here instead of importing each other's modules: ``chainermn-data``
notes how each ``scatter_dataset`` call cut the data (:data:`SCATTER`: one fact per call, in call
order: the dataset's length, ``shuffle``, the seed when it was an int, and a CRC-32 of the order
of the samples); ``chainermn-train``'s checkpointer writes every fact into each snapshot and,
when a job resumes, compares the facts of the resumed run with those of this one.

>>> from chainermn_comm import run_facts
>>> run_facts.note(run_facts.SCATTER, {'n': 1500, 'shuffle': True, 'seed': 0, 'order': 123})
>>> run_facts.facts(run_facts.SCATTER)[-1]['n']
1500

A fact is a dict of JSON values (it travels inside snapshot files).
"""

import threading

__all__ = ['SCATTER', 'note', 'facts', 'clear']

#: Kind of the facts of ``scatter_dataset`` calls.
SCATTER = 'scatter_dataset'

_lock = threading.Lock()
_facts = {}


def note(kind, fact):
    """Add ``fact`` (a dict of JSON values) to the facts of ``kind``."""
    with _lock:
        _facts.setdefault(kind, []).append(dict(fact))


def facts(kind):
    """Return the facts of ``kind`` noted so far, oldest first (a copy)."""
    with _lock:
        return [dict(f) for f in _facts.get(kind, ())]


def clear(kind=None):
    """Forget the facts of ``kind`` (every kind when None); for tests and for programs that start over."""
    with _lock:
        if kind is None:
            _facts.clear()
        else:
            _facts.pop(kind, None)
