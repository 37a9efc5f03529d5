"""Chainer 7.8.1 imports and runs through chainermn's compat hook (``_chainermn_compat``).

Each case runs in a fresh interpreter of this venv, where ``chainermn_precedence.pth`` has
installed the hook at start-up.  On NumPy 1.26 (the README venv) the tests recreate what today's
stack lacks (NumPy 2: no ``numpy.sctypes``; Python 3.12: no ``numpy.distutils``; setuptools 81:
no ``pkg_resources``) by hiding them; in the NumPy 2 venv (``scripts/test.sh --numpy2``) the
same tests run against the real thing.
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NUMPY2 = int(numpy.__version__.split('.')[0]) >= 2

# Hides the named modules (ImportError) and numpy.sctypes, like today's stack does.
HIDE = textwrap.dedent('''
    import importlib.abc, sys
    import numpy
    HIDDEN = %r
    class Hide(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if any(name == h or name.startswith(h + '.') for h in HIDDEN):
                raise ModuleNotFoundError('hidden for the test: ' + name, name=name)
            return None
    for name in [m for m in sys.modules if any(m == h or m.startswith(h + '.') for h in HIDDEN)]:
        del sys.modules[name]
    sys.meta_path.insert(0, Hide())
    if %r:
        vars(numpy).pop('sctypes', None)
''')

PROBE = textwrap.dedent('''
    import builtins, json, sys
    FIRST = %r
    if FIRST == 'chainermn':
        import chainermn
    import chainer
    import chainer.functions as F
    import chainermn
    import numpy
    import _chainermn_compat
    x = numpy.arange(6, dtype=numpy.float32)
    y = F.as_strided(x, (2, 2), (2, 1))  # strides in elements
    check = sys.modules['chainer._environment_check']
    from chainer import gradient_check, testing  # chainer.testing imports pkg_resources
    def skipped(decorator):
        return bool(getattr(decorator(lambda: None), '__unittest_skip__', False))
    def visible(name):
        try:
            __import__(name)
            return True
        except ImportError:
            return False
    print('PROBE ' + json.dumps({
        'as_strided': y.array.tolist(),
        'sctypes': {k: [t.__name__ for t in v] for k, v in numpy.sctypes.items()},
        'applied': _chainermn_compat.applied(),
        'status': _chainermn_compat.status(),
        'scoped_builtins': check.__builtins__ is not builtins and check.__builtins__ is not vars(builtins),
        'check_pkg_resources_real': hasattr(check.pkg_resources, '__file__'),
        'check_numpy_real': check.numpy is numpy,
        'pkg_resources_in_sys_modules': 'pkg_resources' in sys.modules,
        'numpy_distutils_in_sys_modules': 'numpy.distutils' in sys.modules,
        'pkg_resources_visible': visible('pkg_resources'),
        'numpy_distutils_visible': visible('numpy.distutils.system_info'),
        'with_requires_skips': [skipped(testing.with_requires('numpy>=1.0')),
                                skipped(testing.with_requires('numpy<1.0')),
                                skipped(testing.with_requires('no-such-distribution-here'))],
        'chainermn_ours': chainermn.__file__.endswith('/chainermn/__init__.py')
                          and hasattr(chainermn, 'create_multi_node_optimizer'),
    }))
''')


def _run(first='chainer', hide=(), hide_sctypes=False):
    code = (HIDE % (list(hide), hide_sctypes) if hide or hide_sctypes else '') + PROBE % first
    res = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith('PROBE '))
    got = json.loads(line[len('PROBE '):])
    # chainer.gradient_check imports and chainer.testing.with_requires checks for real everywhere.
    assert got['with_requires_skips'] == [False, True, True], got
    return got


def _expected_sctypes():
    import _chainermn_compat
    return {k: [t.__name__ for t in v]
            for k, v in _chainermn_compat.sctypes_like_1_26(numpy).items()}


@pytest.mark.skipif(NUMPY2, reason='compares with the real numpy.sctypes of NumPy 1.x')
def test_sctypes_like_1_26_equals_numpy_1_26s():
    import _chainermn_compat
    assert numpy.__version__.startswith('1.26')
    assert _chainermn_compat.sctypes_like_1_26(numpy) == numpy.sctypes


@pytest.mark.skipif(NUMPY2, reason='NumPy 1.26 only')
def test_nothing_happens_on_numpy_1_26_python_3_11():
    got = _run()
    assert got['applied'] == [], got
    assert got['status'][0] is False, got
    assert got['scoped_builtins'] is False, got
    assert got['check_pkg_resources_real'] is True and got['check_numpy_real'] is True, got


@pytest.mark.parametrize('first', ['chainer', 'chainermn'])
def test_chainer_imports_without_sctypes_distutils_and_pkg_resources(first):
    got = _run(first, hide=['pkg_resources', 'numpy.distutils'], hide_sctypes=True)
    assert got['as_strided'] == [[0.0, 1.0], [2.0, 3.0]], got
    assert got['sctypes'] == _expected_sctypes(), got
    assert {'numpy.sctypes', 'chainer._environment_check'} <= set(got['applied']), got
    assert got['status'][0] is True, got
    reasons = ' '.join(got['status'][1])
    assert 'numpy.sctypes' in reasons and 'numpy.distutils' in reasons and 'pkg_resources' in reasons
    # The stand-ins exist for chainer._environment_check only: nobody else can import them.
    assert got['scoped_builtins'] is True, got
    assert got['check_pkg_resources_real'] is False and got['check_numpy_real'] is False, got
    assert got['pkg_resources_in_sys_modules'] is False, got
    assert got['numpy_distutils_in_sys_modules'] is False, got
    assert got['pkg_resources_visible'] is False, got
    assert got['numpy_distutils_visible'] is False, got
    assert got['chainermn_ours'] is True, got


def _exists(name):
    import importlib.util
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


@pytest.mark.parametrize('hide', ['pkg_resources', 'numpy.distutils'])
def test_a_module_that_exists_is_never_replaced(hide):
    """With one of the two hidden, Chainer gets the other one for real wherever it exists."""
    got = _run(hide=[hide])
    if hide == 'pkg_resources' and _exists('numpy.distutils'):
        assert got['check_numpy_real'] is True, got
        assert got['numpy_distutils_in_sys_modules'] is True, got  # imported for real, as Chainer does
    if hide == 'numpy.distutils' and _exists('pkg_resources'):
        assert got['check_pkg_resources_real'] is True, got
        assert got['pkg_resources_in_sys_modules'] is True, got
    assert got['scoped_builtins'] is True, got


@pytest.mark.skipif(not NUMPY2, reason='NumPy 2 only')
def test_numpy2_for_real():
    got = _run()
    assert got['as_strided'] == [[0.0, 1.0], [2.0, 3.0]], got
    assert got['sctypes'] == _expected_sctypes(), got
    assert 'numpy.sctypes' in got['applied'], got
    assert got['status'][0] is True, got


def test_pth_installs_both_hooks_once():
    code = ('import sys, _chainermn_compat, _chainermn_precedence; '
            'names = [type(f).__name__ for f in sys.meta_path]; '
            'print(names.count("CompatFinder"), names.count("ChainermnFinder"), '
            '_chainermn_compat.install() is _chainermn_compat.installed())')
    res = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, timeout=120)
    assert res.stdout.split() == ['1', '1', 'True'], res.stdout + res.stderr


def test_doctor_reports_whether_the_hook_is_active():
    res = subprocess.run([sys.executable, '-m', 'chainermn', 'doctor', '--no-cuda-aware-check'],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    row = next((ln for ln in res.stdout.splitlines() if ln.startswith('chainer compat')), None)
    assert row is not None, res.stdout + res.stderr
    assert row.split()[2] == 'OK', row
    assert row.split()[3] == ('active:' if NUMPY2 else 'inactive:'), row


# ---------------------------------------------------------------------------------------------
# NumPy 2 semantics inside Chainer (NEP 50): this process imported Chainer through the hook, so
# on NumPy 2 the fixes are in place; on NumPy 1.26 the same assertions hold natively.

def test_reporter_summary_averages_float32_in_float64():
    import chainer
    s = chainer.reporter.Summary()
    for i in range(1000):
        s.add(numpy.float32(1000.1 + (i % 2) * 0.01))
    mean, std = s.make_statistics()
    assert mean.dtype == numpy.float64, mean
    assert abs(float(std) - 0.005) < 1e-4, std  # float32 sums give NaN or 0 here
    d = chainer.reporter.DictSummary()
    d.add({'a': numpy.float32(0.5), 'b': chainer.Variable(numpy.array(0.25, numpy.float32))})
    d.add({'a': numpy.float32(0.1), 'b': chainer.Variable(numpy.array(0.75, numpy.float32))})
    means = d.compute_mean()
    assert {k: v.dtype for k, v in means.items()} == {'a': numpy.float64, 'b': numpy.float64}
    assert means['a'] == (numpy.float64(numpy.float32(0.5)) + numpy.float64(numpy.float32(0.1))) / 2


def test_gradient_clipping_norm_and_scale_as_on_numpy_1():
    import chainer
    rng = numpy.random.RandomState(3)
    link = chainer.ChainList(*[chainer.links.Linear(20, 20) for _ in range(40)])  # 80 arrays
    grads = [(rng.standard_normal(p.shape) * 10 ** rng.uniform(-3, 3)).astype(numpy.float32)
             for p in link.params()]
    for p, g in zip(link.params(), grads):
        p.grad = g.copy()
    opt = chainer.optimizers.SGD()
    opt.setup(link)
    hook = chainer.optimizer_hooks.GradientClipping(1.0)
    hook(opt)
    sqnorm = sum((numpy.float64(g.ravel().dot(g.ravel())) for g in grads), numpy.float64(0))
    rate = numpy.float32(1.0 / numpy.sqrt(sqnorm))  # NumPy 1: float64 norm, float32 multiply
    for p, g in zip(link.params(), grads):
        assert p.grad.dtype == numpy.float32
        assert numpy.array_equal(p.grad, g * rate), numpy.abs(p.grad - g * rate).max()


@pytest.mark.skipif(not NUMPY2, reason='NumPy 2 only')
def test_every_numpy2_fix_was_applied_here():
    import chainer.optimizer_hooks  # noqa: F401
    import chainer.reporter  # noqa: F401
    import _chainermn_compat
    assert set(_chainermn_compat.NUMPY2_FIXES) <= set(_chainermn_compat.applied())
