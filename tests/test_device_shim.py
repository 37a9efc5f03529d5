"""scripts/device/sitecustomize.py lets Chainer 7.8.1 import without numpy.sctypes, numpy.distutils and pkg_resources."""

import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), '..'))
SHIM = os.path.join(ROOT, 'scripts', 'device', 'sitecustomize.py')

# Recreate, on this venv's NumPy 1.x and Python 3.11, what the GPU image lacks: NumPy 2 has no
# sctypes, Python 3.12 no numpy.distutils, setuptools 81 no pkg_resources.
PROBE = r'''
import importlib.abc, runpy, sys
import numpy

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == 'pkg_resources' or name.startswith('numpy.distutils'):
            raise ImportError('blocked for the test: ' + name)
        return None

for name in [m for m in sys.modules if m == 'pkg_resources' or m.startswith('numpy.distutils')]:
    del sys.modules[name]
sys.meta_path.insert(0, Block())
del numpy.sctypes
try:
    import chainer
except Exception as e:
    print('without shim:', type(e).__name__)
for name in [m for m in list(sys.modules) if m.startswith('chainer')]:
    del sys.modules[name]
runpy.run_path(sys.argv[1])
import chainer
import chainer.functions as F
x = numpy.arange(6, dtype=numpy.float32)
y = F.as_strided(x, (2, 2), (2, 1))  # strides in elements
assert y.array.tolist() == [[0.0, 1.0], [2.0, 3.0]], y.array
assert sorted(numpy.sctypes) == ['complex', 'float', 'int', 'others', 'uint']
print('with shim: chainer', chainer.__version__)
'''


def test_shim_lets_chainer_import_without_what_numpy2_and_py312_removed():
    res = subprocess.run([sys.executable, '-c', PROBE, SHIM], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith('without shim: '), lines  # the probe really removed something
    assert lines[-1] == 'with shim: chainer 7.8.1', lines
