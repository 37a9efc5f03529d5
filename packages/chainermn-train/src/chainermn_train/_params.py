"""Helpers on a link's parameters and persistents shared by the optimizer and extensions."""

__all__ = ['param_signature', 'describe_difference', 'sorted_params', 'iter_persistents']


def sorted_params(link):
    """Return ``[(name, param)]`` of ``link`` sorted by name (the same order on every rank)."""
    return sorted(link.namedparams(), key=lambda kv: kv[0])


def param_signature(link):
    """Return the names, shapes and dtypes of the initialised parameters of ``link``."""
    sig = []
    for name, p in sorted_params(link):
        if p.array is None:
            sig.append((name, None, None))
        else:
            sig.append((name, tuple(p.array.shape), p.array.dtype.str))
    return tuple(sig)


def describe_difference(mine, theirs):
    """Return where the signature ``mine`` first differs from ``theirs`` (rank 0's), in words."""
    def fmt(entry):
        name, shape, dtype = entry
        return '{} uninitialised'.format(name) if shape is None else '{} {} {}'.format(
            name, shape, dtype)

    if mine == theirs:
        return 'the same as rank 0'
    for a, b in zip(mine, theirs):
        if a != b:
            return 'has {} where rank 0 has {}'.format(fmt(a), fmt(b))
    return '{} parameters where rank 0 has {}'.format(len(mine), len(theirs))


def iter_persistents(link):
    """Yield ``(path, owner_link, attr_name, value)`` for every persistent, sorted by path."""
    items = []
    for lpath, owner in link.namedlinks():
        for attr in getattr(owner, '_persistent', ()):
            path = (lpath.rstrip('/') + '/' + attr)
            items.append((path, owner, attr, owner.__dict__.get(attr)))
    items.sort(key=lambda t: t[0])
    return items
