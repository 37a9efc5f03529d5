"""Helper for the documented submodules that re-export a sub-package module."""

__all__ = ['public_names']


def public_names(module):
    """Return ``module.__all__`` (or its public names when it has none) as a list."""
    names = getattr(module, '__all__', None)
    if names is None:
        names = [n for n in vars(module) if not n.startswith('_')]
    return list(names)
