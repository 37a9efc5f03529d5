"""Let a bench script run as the peer: Chainer 7.8.1's bundled ``chainermn``, not our packages.

A peer run starts under ``python -S``: the venv's site-packages is then added without its
.pth files, so our editable packages are not importable and ``import chainermn`` resolves
to the copy Chainer 7.8.1 installs.  Call :func:`enter` first thing, before numpy or mpi4py.
"""

import importlib.util
import os
import sys

__all__ = ['enter']


def enter(flag='--peer'):
    """Check ``flag`` in argv against ``python -S``; under -S add the venv's site-packages, .pth-free."""
    if flag in sys.argv and not sys.flags.no_site:
        sys.exit('{} must run under `python -S` so that our packages are not importable'.format(flag))
    if not sys.flags.no_site:
        return
    venv = os.path.dirname(os.path.dirname(os.path.abspath(sys.executable)))
    sys.path.append(os.path.join(venv, 'lib', 'python{}.{}'.format(*sys.version_info[:2]),
                                 'site-packages'))
    # mpi4py finds the MPICH wheel's libmpi under site.PREFIXES; under -S importing site
    # only records the prefixes (no .pth processing).
    sys.prefix = sys.exec_prefix = venv
    import site  # noqa: F401
    _install_compat_hook()


def _install_compat_hook():
    """Install chainermn's Chainer compat hook from the checkout (-S skipped its .pth).

    Chainer 7.8.1 needs it on NumPy 2 / setuptools 81; the hook imports nothing of ours, so the
    peer still runs Chainer's own bundled ``chainermn``.
    """
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'packages',
                        'chainermn', 'src', '_chainermn_compat.py')
    spec = importlib.util.spec_from_file_location('_chainermn_compat', path)
    compat = importlib.util.module_from_spec(spec)
    sys.modules['_chainermn_compat'] = compat
    spec.loader.exec_module(compat)
    compat.install()
