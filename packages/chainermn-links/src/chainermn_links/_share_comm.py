"""Deep copies of links that hold a communicator share the communicator instead of copying it."""

__all__ = ['deepcopy_sharing_comm']


def deepcopy_sharing_comm(obj, memo):
    """Deep-copy ``obj`` (a link with a ``comm`` attribute), keeping the same communicator."""
    import copy
    comm = obj.__dict__.get('comm')
    if comm is not None:
        memo.setdefault(id(comm), comm)
    cls = type(obj)
    new = cls.__new__(cls)
    memo[id(obj)] = new
    for k, v in obj.__dict__.items():
        new.__dict__[k] = copy.deepcopy(v, memo)
    return new
