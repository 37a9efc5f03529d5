"""Let Chainer 7.8.1 import and run on NumPy 2, Python 3.12+ and setuptools 81+.

``chainermn_precedence.pth`` calls :func:`install` at interpreter start-up.  That only puts a
finder on ``sys.meta_path``; nothing is imported and nothing changes until a Chainer module
named in :data:`FIXES` is imported, whichever of ``chainer`` and ``chainermn`` comes first.
Each fix applies only where what it stands in for is missing (see :func:`status`), so on
NumPy 1.26 with Python 3.11 and setuptools<81 nothing at all happens:

- ``numpy.sctypes`` (removed in NumPy 2.0), read by ``chainer.functions.array.as_strided``:
  set to the dict NumPy 1.26 has, before that module runs, only when NumPy lacks it.
- ``numpy.distutils.system_info`` (gone on Python 3.12) and ``pkg_resources`` (gone from
  setuptools 81), imported by ``chainer._environment_check`` (and ``pkg_resources`` by
  ``chainer.testing``, which ``chainer.gradient_check`` imports): stand-ins are visible to those
  modules' own ``import`` statements only (their ``__builtins__`` get an ``__import__`` that
  tries the real module first).  ``sys.modules`` never sees them.
- NumPy 2 behaviour changes inside Chainer functions our documented API and examples use:
  see :data:`NUMPY2_FIXES` (each one is listed with its reason in packages/chainermn/README.md).
"""

import builtins
import importlib.util
import sys
import types

__all__ = ['BEFORE', 'CompatFinder', 'FIXES', 'NUMPY2_FIXES', 'applied', 'install', 'installed',
           'sctypes_like_1_26', 'status']


# ---------------------------------------------------------------------------------------------
# What is missing (each check imports nothing but NumPy, and NumPy only when asked).

#: What this module has done in this process, in order (module names and 'numpy.sctypes').
_applied = []


def _numpy_lacks_sctypes():
    import numpy
    return 'sctypes' not in vars(numpy) or 'numpy.sctypes' in _applied


def _module_missing(name):
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):
        return True


def _numpy_major():
    import numpy
    return int(numpy.__version__.split('.')[0])


def applied():
    """Return what this module has changed in this process so far (a list of names)."""
    return list(_applied)


def status():
    """Return ``(active, reasons)``: whether Chainer needs this module here, and why (or why not)."""
    import numpy
    reasons = []
    if _numpy_lacks_sctypes():
        reasons.append('NumPy {} has no numpy.sctypes'.format(numpy.__version__))
    if _module_missing('numpy.distutils'):
        reasons.append('no numpy.distutils (Python {}.{}, NumPy {})'.format(
            sys.version_info[0], sys.version_info[1], numpy.__version__))
    if _module_missing('pkg_resources'):
        reasons.append('no pkg_resources (setuptools 81+ or none)')
    if _numpy_major() >= 2:
        reasons.append('NumPy 2 promotion rules: {} adjusted'.format(', '.join(sorted(NUMPY2_FIXES))))
    if reasons:
        return True, reasons
    return False, ['NumPy {} and Python {}.{} have what Chainer 7.8.1 needs'.format(
        numpy.__version__, sys.version_info[0], sys.version_info[1])]


# ---------------------------------------------------------------------------------------------
# numpy.sctypes as NumPy 1.26 builds it.

def sctypes_like_1_26(numpy):
    """Return the ``sctypes`` dict NumPy 1.26 would have on this platform, from ``numpy``'s types."""
    def sized(kind, sizes):
        found = []
        for size in sizes:
            try:
                t = numpy.dtype('{}{}'.format(kind, size)).type
            except TypeError:
                continue
            if t not in found:
                found.append(t)
        return found

    out = {
        'int': sized('i', (1, 2, 4, 8, 16, 32, 64)),
        'uint': sized('u', (1, 2, 4, 8, 16, 32, 64)),
        'float': sized('f', (2, 4, 8, 10, 12, 16, 32, 64)),
        'complex': sized('c', (4, 8, 16, 20, 24, 32, 64, 128)),
        'others': [bool, object, bytes, str, numpy.void],
    }
    # NumPy 1.26 also lists the pointer-sized integers where no sized name covers them.
    intp, uintp = numpy.dtype('p').type, numpy.dtype('P').type
    if intp not in out['int']:
        at = sum(1 for t in out['int'] if numpy.dtype(t).itemsize <= numpy.dtype(intp).itemsize)
        out['int'].insert(at, intp)
        out['uint'].insert(at, uintp)
    return out


def _add_sctypes():
    import numpy
    if 'sctypes' not in vars(numpy):
        numpy.sctypes = sctypes_like_1_26(numpy)
        _applied.append('numpy.sctypes')


# ---------------------------------------------------------------------------------------------
# Stand-ins for chainer._environment_check's imports, scoped to that module.

class _DistributionNotFound(Exception):
    """Raised by the stand-in ``require``: the optional dependency counts as not installed."""


def _pkg_resources_stand_in():
    mod = types.ModuleType('pkg_resources')
    mod.__doc__ = 'chainermn stand-in for chainer._environment_check only (no pkg_resources here).'

    class ResolutionError(Exception):
        """Base of the stand-in's errors."""

    class DistributionNotFound(ResolutionError, _DistributionNotFound):
        """The requirement is treated as not installed."""

    class VersionConflict(ResolutionError):
        """Never raised by the stand-in."""

    def require(requirement):
        """Report the optional dependency as absent, so Chainer skips its version warning."""
        raise DistributionNotFound(requirement)

    def get_distribution(name):
        """Never reached: ``require`` never raises VersionConflict."""
        raise DistributionNotFound(name)

    class WorkingSet(object):
        """What ``chainer.testing.with_requires`` and friends call: a real requirement check."""

        def require(self, *requirements):
            """Raise unless every requirement is installed at a matching version."""
            import importlib.metadata
            try:
                from packaging.requirements import Requirement
            except ImportError:
                raise ResolutionError('cannot check {} without the packaging module'.format(
                    requirements))
            for text in requirements:
                req = Requirement(text)
                try:
                    version = importlib.metadata.version(req.name)
                except importlib.metadata.PackageNotFoundError:
                    raise DistributionNotFound(text)
                if not req.specifier.contains(version, prereleases=True):
                    raise VersionConflict('{} is installed, {} is required'.format(version, text))
            return []

    mod.WorkingSet = WorkingSet
    mod.ResolutionError = ResolutionError
    mod.DistributionNotFound = DistributionNotFound
    mod.VersionConflict = VersionConflict
    mod.require = require
    mod.get_distribution = get_distribution
    return mod


class _NumpyWithDistutils(types.ModuleType):
    """What ``import numpy.distutils.system_info`` binds: NumPy plus a ``distutils`` stand-in."""

    def __init__(self, numpy):
        super(_NumpyWithDistutils, self).__init__('numpy')
        system_info = types.ModuleType('numpy.distutils.system_info')
        system_info.get_info = lambda name, notfound_action=0: {}  # nothing detected: no warning
        distutils = types.ModuleType('numpy.distutils')
        distutils.system_info = system_info
        self.distutils = distutils
        self._numpy = numpy

    def __getattr__(self, name):
        return getattr(self._numpy, name)


def _scoped_import(real_import):
    def __import__(name, globals=None, locals=None, fromlist=(), level=0):
        try:
            return real_import(name, globals, locals, fromlist, level)
        except ImportError:
            if level != 0:
                raise
            if name == 'pkg_resources':
                return _pkg_resources_stand_in()
            if name == 'numpy.distutils.system_info' and not fromlist:
                import numpy
                return _NumpyWithDistutils(numpy)
            raise
    return __import__


def _scope_imports(module):
    """Give ``module`` an ``__import__`` that falls back to the stand-ins, if any is needed."""
    if not (_module_missing('numpy.distutils') or _module_missing('pkg_resources')):
        return
    scoped = dict(vars(builtins))
    scoped['__import__'] = _scoped_import(builtins.__import__)
    module.__builtins__ = scoped
    _applied.append(module.__name__)


# ---------------------------------------------------------------------------------------------
# NumPy 2 behaviour changes inside Chainer.

def _float64_summaries(module):
    """Make ``chainer.reporter.Summary`` accumulate NumPy floats in float64, as on NumPy 1."""
    import numpy
    summary = module.Summary
    if getattr(summary.add, '_chainermn_compat', False):
        return
    add = summary.add

    def add_float64(self, value, weight=1):
        # NumPy 1 computed a Python-number weight times a float32 scalar (or 0-d array) in
        # float64, and 0.0 + float32 in float64; NumPy 2 (NEP 50) keeps float32, so the mean
        # loses digits and E[x^2] - E[x]^2 can go negative (std NaN).  Redo NumPy 1's
        # promotion for NumPy values; CuPy values are left alone.
        if _is_numpy_low_float(value):
            if type(weight) in (int, float):
                value = numpy.float64(value)
            if type(self._x) is float:
                self._x, self._x2 = numpy.float64(self._x), numpy.float64(self._x2)
        return add(self, value, weight)

    add_float64.__doc__ = add.__doc__
    add_float64._chainermn_compat = True
    summary.add = add_float64


def _is_numpy_low_float(value):
    import numpy
    return (isinstance(value, (numpy.generic, numpy.ndarray)) and value.ndim == 0
            and value.dtype.kind == 'f' and value.dtype.itemsize < 8)


def _numpy1_gradient_clipping(module):
    """Make ``GradientClipping`` compute its norm and scale as on NumPy 1 (NumPy gradients)."""
    import numpy
    clipping = module.GradientClipping
    if getattr(clipping.__call__, '_chainermn_compat', False):
        return
    call = clipping.__call__

    def __call__(self, opt):
        # NumPy 1: the builtin sum of the float32 dot products (start 0) promoted to float64,
        # and `grad *= rate` with the float64 rate ran in the gradient's dtype (value-based
        # casting).  NumPy 2 (NEP 50) sums in float32 and multiplies in float64.
        params = list(opt.target.params(False))
        grads = [p.grad for p in params]
        if not grads or not all(type(g) is numpy.ndarray for g in grads):
            return call(self, opt)  # CuPy/ChainerX gradients: unchanged
        sqnorm = builtins.sum((g.ravel().dot(g.ravel()) for g in grads), numpy.float64(0))
        rate = self.threshold / numpy.sqrt(sqnorm)
        if rate >= 1:
            return
        for grad in grads:
            grad *= grad.dtype.type(rate)

    __call__.__doc__ = call.__doc__
    __call__._chainermn_compat = True
    clipping.__call__ = __call__


#: {module name: (what NumPy 2 changed, function(module) that fixes it)}: applied right after
#: the module ran, on NumPy 2 only.
NUMPY2_FIXES = {
    'chainer.reporter': ('NEP 50 scalar promotion: reporter.Summary (and DictSummary, '
                         'LogReport, Evaluator results) averaged float32 values in float32',
                         _float64_summaries),
    'chainer.optimizer_hooks.gradient_clipping': (
        'NEP 50 scalar promotion: GradientClipping summed the float32 squared norms of the '
        'parameters in float32 and scaled the gradients in float64', _numpy1_gradient_clipping),
}

#: {module name: function(module) run before the module's code}: each decides whether it is needed.
BEFORE = {
    'chainer.functions.array.as_strided': lambda module: _add_sctypes(),
    'chainer._environment_check': lambda module: _scope_imports(module),
    # chainer.testing (imported by chainer.gradient_check) imports pkg_resources too.
    'chainer.testing.helper': lambda module: _scope_imports(module),
    'chainer.testing.doctest_helper': lambda module: _scope_imports(module),
}

#: Every module name the finder wraps.
FIXES = frozenset(BEFORE) | frozenset(NUMPY2_FIXES)


class _Loader(object):
    """Run the real loader, with the module's fixes before and after it."""

    def __init__(self, loader, name):
        self._loader = loader
        self._name = name

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        before = BEFORE.get(self._name)
        if before is not None:
            before(module)
        self._loader.exec_module(module)
        if self._name in NUMPY2_FIXES and _numpy_major() >= 2:
            NUMPY2_FIXES[self._name][1](module)
            _applied.append(self._name)

    def __getattr__(self, name):
        return getattr(self._loader, name)


class CompatFinder(object):
    """Meta-path finder that wraps the loader of the Chainer modules this module fixes."""

    _chainermn_compat = True

    def find_spec(self, fullname, path=None, target=None):
        """Return the real spec with a wrapped loader for a fixed module; None for any other."""
        if fullname not in FIXES:
            return None
        for finder in sys.meta_path:
            if finder is self or getattr(finder, '_chainermn_compat', False):
                continue
            find = getattr(finder, 'find_spec', None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, 'exec_module'):
                    spec.loader = _Loader(spec.loader, fullname)
                return spec
        return None

    def invalidate_caches(self):
        """Nothing is cached here."""

    def __repr__(self):
        return 'CompatFinder()'


def installed():
    """Return the installed finder, or None."""
    for finder in sys.meta_path:
        if getattr(finder, '_chainermn_compat', False):
            return finder
    return None


def install():
    """Put the finder first on ``sys.meta_path`` (once) and return it."""
    finder = installed()
    if finder is None:
        finder = CompatFinder()
        sys.meta_path.insert(0, finder)
    return finder
