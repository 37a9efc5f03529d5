"""Suggest the known name closest to a name that does not exist ("Did you mean ...?")."""

import difflib

__all__ = ['closest', 'did_you_mean']


def closest(word, choices, aliases=None):
    """Return the entry of ``choices`` closest to ``word`` (case-insensitive), or None if none is close.

    ``aliases`` maps other spellings users type (``'bf16'``) to a choice (``'bfloat16'``).
    """
    if not isinstance(word, str) or not word.strip():
        return None
    key = word.strip().lower()
    aliases = {k.lower(): v for k, v in (aliases or {}).items()}
    if key in aliases:
        return aliases[key]
    by_key = {}
    for choice in choices:
        by_key.setdefault(str(choice).lower(), choice)
    found = difflib.get_close_matches(key, list(by_key) + list(aliases), n=1)
    if not found:
        return None
    return aliases.get(found[0], by_key.get(found[0]))


def did_you_mean(word, choices, aliases=None):
    """Return ``" Did you mean 'NAME'?"`` for the closest of ``choices`` to ``word``, or ``''``."""
    best = closest(word, choices, aliases)
    return '' if best is None else ' Did you mean {!r}?'.format(best)
