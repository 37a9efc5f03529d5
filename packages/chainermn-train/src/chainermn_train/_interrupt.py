"""The interrupt report's word on checkpoints: the newest complete one of each multi-node checkpointer.

Registered with :func:`chainermn_comm.voice.on_interrupt` when ``chainermn_train`` is imported: a
job ended by Ctrl-C then says, in its one line, from which checkpoint a rerun resumes.
"""

from chainermn_comm import voice

__all__ = ['newest_complete']


def _checkpointers(trainer):
    from chainermn_train.checkpoint._checkpointer import MultiNodeCheckpointer
    entries = getattr(trainer, '_extensions', {}) or {}
    return [e.extension for e in entries.values() if isinstance(e.extension, MultiNodeCheckpointer)]


def newest_complete(trainer):
    """Return 'newest complete checkpoint: iteration N (NAME in PATH)' for ``trainer``'s checkpointers, or None."""
    if trainer is None:
        return None
    phrases = []
    for cp in _checkpointers(trainer):
        ranks = {}
        for rank, iteration in cp.visible_files():
            ranks.setdefault(iteration, set()).add(rank)
        size = cp.comm.size
        complete = [it for it, seen in ranks.items() if seen >= set(range(size))]
        where = '{!r} in {}'.format(cp.name, cp.path)
        if complete:
            phrases.append('newest complete checkpoint: iteration {} ({})'.format(max(complete), where))
        else:
            phrases.append('no complete checkpoint ({})'.format(where))
    return '; '.join(phrases) or None


voice.on_interrupt(newest_complete)
