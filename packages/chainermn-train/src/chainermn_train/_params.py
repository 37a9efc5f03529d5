"""Helpers on a link's parameters and persistents shared by the optimizer and extensions."""

__all__ = ['param_signature', 'sorted_params', 'iter_persistents']


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


def iter_persistents(link):
    """Yield ``(path, owner_link, attr_name, value)`` for every persistent, sorted by path."""
    items = []
    for lpath, owner in link.namedlinks():
        for attr in getattr(owner, '_persistent', ()):
            path = (lpath.rstrip('/') + '/' + attr)
            items.append((path, owner, attr, owner.__dict__.get(attr)))
    items.sort(key=lambda t: t[0])
    return items
