"""Helpers for the tests that build our wheels and install them into fresh venvs (not a test module)."""

import os
import re
import subprocess
import sys

__all__ = ['LIBRARIES', 'PACKAGES', 'ROOT', 'build_sdists', 'build_wheels', 'env', 'new_bare_venv',
           'repo_version', 'run']

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The library packages, then the tools, then the meta-package (dependency order).
LIBRARIES = ['chainermn-comm', 'chainermn-data', 'chainermn-links', 'chainermn-train']
PACKAGES = LIBRARIES + ['chainermn-tools', 'chainermn']


def run(cmd, timeout=900, **kw):
    """Run ``cmd``; fail the test with its output unless it exits 0; return the result."""
    res = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout,
                         **kw)
    assert res.returncode == 0, '{}\n{}\n{}'.format(' '.join(map(str, cmd)), res.stdout[-5000:],
                                                     res.stderr[-5000:])
    return res


def env(**changes):
    """This process's environment with ``changes`` (None removes a variable)."""
    out = dict(os.environ)
    for key, value in changes.items():
        out.pop(key, None)
        if value is not None:
            out[key] = value
    return out


def repo_version(package):
    """Return the version ``packages/<package>/pyproject.toml`` declares."""
    with open(os.path.join(ROOT, 'packages', package, 'pyproject.toml')) as f:
        return re.search(r'^version = "([^"]+)"$', f.read(), re.M).group(1)


def build_wheels(out, root=ROOT):
    """Build our six wheels from ``root``/packages into ``out`` with ``pip wheel``; return them, sorted.

    poetry-core from this venv (no build isolation needed).
    """
    run([sys.executable, '-m', 'pip', 'wheel', '-q', '--no-deps', '--no-build-isolation',
         '-w', out] + [os.path.join(root, 'packages', p) for p in PACKAGES])
    found = sorted(os.path.join(str(out), n) for n in os.listdir(str(out)) if n.endswith('.whl'))
    assert len(found) == len(PACKAGES), found
    return found


def build_sdists(out, root=ROOT):
    """Build our six sdists from ``root``/packages into ``out`` with poetry-core's PEP 517 API."""
    code = ('import os, sys\n'
            'from poetry.core.masonry import api\n'
            'for src in sys.argv[2:]:\n'
            '    os.chdir(src)\n'
            '    api.build_sdist(sys.argv[1])\n')
    run([sys.executable, '-c', code, os.path.abspath(str(out))]
        + [os.path.join(root, 'packages', p) for p in PACKAGES])
    found = sorted(os.path.join(str(out), n) for n in os.listdir(str(out)) if n.endswith('.tar.gz'))
    assert len(found) == len(PACKAGES), found
    return found


def new_bare_venv(path):
    """Create a venv without pip (fast: no ensurepip); return (python, pip command for it).

    The returned pip is this venv's pip driving the new interpreter (``pip --python``), so it
    shares this pip's version and cache.
    """
    run([sys.executable, '-m', 'venv', '--without-pip', path])
    python = os.path.join(str(path), 'bin', 'python')
    return python, [sys.executable, '-m', 'pip', '--python', python]
