"""Make ``import chainermn`` load this distribution's package, not the copy bundled with Chainer.

Chainer 7.8.1 installs an older ``chainermn`` package into site-packages.  Our package is
installed under ``site-packages/_chainermn_meta/chainermn`` (wheel) or stays in
``packages/chainermn/src/chainermn`` (editable install), so the two never share files, and the
``chainermn_precedence.pth`` file shipped in the wheel calls :func:`install` at interpreter
start-up, which puts a finder in front of ``sys.meta_path`` that resolves the top-level name
``chainermn`` to our directory.  Submodules follow from the package's ``__path__``.
"""

import importlib.machinery
import os
import sys

__all__ = ['ChainermnFinder', 'install', 'package_root']

_HERE = os.path.dirname(os.path.abspath(__file__))
#: Directory name (inside site-packages) that holds our ``chainermn`` package in a wheel install.
CONTAINER = '_chainermn_meta'


def package_root():
    """Return the directory that contains our ``chainermn`` package, or None if it is missing."""
    for root in (os.path.join(_HERE, CONTAINER), _HERE):
        init = os.path.join(root, 'chainermn', '__init__.py')
        marker = os.path.join(root, 'chainermn', '_meta_marker.py')
        if os.path.isfile(init) and os.path.isfile(marker):
            return root
    return None


class ChainermnFinder(object):
    """Meta-path finder that resolves the top-level name ``chainermn`` to our package."""

    _chainermn_precedence = True

    def __init__(self, root):
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        """Return the spec of our ``chainermn`` package; leave every other name to the next finder."""
        if fullname != 'chainermn':
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [self.root])

    def invalidate_caches(self):
        """Nothing is cached here."""

    def __repr__(self):
        return 'ChainermnFinder({!r})'.format(self.root)


def install():
    """Put the finder first on ``sys.meta_path`` (once); return it, or None if our package is missing."""
    for finder in sys.meta_path:
        if getattr(finder, '_chainermn_precedence', False):
            return finder
    root = package_root()
    if root is None:
        return None
    finder = ChainermnFinder(root)
    sys.meta_path.insert(0, finder)
    return finder
