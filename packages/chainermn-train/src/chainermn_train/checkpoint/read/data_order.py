"""Did the resumed job cut its data as the run it resumes did?  (``scatter_dataset``'s order.)

``chainermn-data`` notes each ``scatter_dataset`` call in ``chainermn_comm.run_facts`` (length,
``shuffle``, the seed, a CRC-32 of the order of the samples).  Every snapshot records these facts
(metadata key :data:`META_KEY`, JSON).  When a job resumes, the facts of its own calls so far
(``scatter_dataset`` runs before ``maybe_load``, as in the Quick start) are compared, call by
call, with the loaded generation's: where the order differs, the shards of this job hold other
samples than the ones the snapshot's iterators were positioned in, and every rank warns (rank 0
shows it) naming the fix.  ``shuffle=True`` without a seed always gives another order, so it is
warned about also when the snapshot recorded nothing (written by an older chainermn).
"""

import json

from chainermn_comm import run_facts, voice

from chainermn_train.checkpoint.ownership.trust import CheckpointWarning

__all__ = ['META_KEY', 'meta', 'recorded', 'differences', 'check']

#: Metadata key of the ``scatter_dataset`` facts in a snapshot.
META_KEY = 'scatter_dataset'


def meta():
    """Return the metadata entries that record this run's ``scatter_dataset`` calls ({} when none)."""
    facts = run_facts.facts(run_facts.SCATTER)
    return {META_KEY: json.dumps(facts, sort_keys=True)} if facts else {}


def recorded(files):
    """Return the facts a generation recorded (``files``: ``{rank: [(seen_by, meta)]}``), or None."""
    for seen in files.values():
        for _, m in seen:
            text = m.get(META_KEY) if isinstance(m, dict) else None
            if isinstance(text, str):
                try:
                    facts = json.loads(text)
                except ValueError:
                    continue
                if isinstance(facts, list) and all(isinstance(f, dict) for f in facts):
                    return facts
    return None


def differences(before, now):
    """Return ``[(call number, fact now, fact before or None)]`` of the calls whose order differs."""
    out = []
    for i, cur in enumerate(now):
        old = before[i] if before is not None and i < len(before) else None
        if old is None:
            differs = cur.get('shuffle') and not cur.get('seeded')   # a fresh random order
        else:
            differs = (old.get('n'), old.get('order')) != (cur.get('n'), cur.get('order'))
        if differs:
            out.append((i + 1, cur, old))
    return out


def _describe(fact):
    seed = fact.get('seed') if fact.get('seed') is not None else ('given' if fact.get('seeded') else None)
    return '{} samples, shuffle={}, seed={}'.format(fact.get('n'), bool(fact.get('shuffle')), seed)


def _fix(cur, old):
    if old is not None and old.get('shuffle') and old.get('seed') is not None:
        return ('pass the seed the resumed run used on every run: scatter_dataset(..., shuffle=True, '
                'seed={})'.format(old['seed']))
    return ('pass the same seed on every run, e.g. scatter_dataset(..., shuffle=True, seed=0) (the '
            'run that wrote the snapshot had another order, so this resume cannot get its shards '
            'back; the next one will)')


def check(files, rank, name):
    """Warn (every rank; rank 0 shows it) when this run's ``scatter_dataset`` calls cut the data otherwise."""
    found = differences(recorded(files), run_facts.facts(run_facts.SCATTER))
    if not found:
        return found
    parts = []
    for number, cur, old in found:
        parts.append('call {} ({}){}'.format(number, _describe(cur), '' if old is None else
                                             '; the snapshot\'s run: {}'.format(_describe(old))))
    number, cur, old = found[0]
    voice.warn_all(
        'the shards of this job differ from those of the run it resumes from the snapshots {!r}: '
        'scatter_dataset cut the data in another order ({}), so every rank now holds other samples '
        'than those the snapshot\'s iterators were positioned in (the epoch in progress repeats some '
        'and skips others). To fix: {}.'.format(name, '; '.join(parts), _fix(cur, old)),
        CheckpointWarning, rank, stacklevel=4)
    return found
