"""Let Chainer 7.8.1 import where NumPy is 2.x or Python is 3.12 (the GPU machine's image).

Chainer 7.8.1 imports ``numpy.distutils`` and ``pkg_resources`` at start-up and reads
``numpy.sctypes``; NumPy 2 dropped ``sctypes``, Python 3.12 dropped ``numpy.distutils`` and
setuptools 81 dropped ``pkg_resources``.  This file is put on ``PYTHONPATH`` only by
``scripts/device/gpu_check.sh``; it is never installed with the packages.
"""

import sys
import types

import numpy

try:
    numpy.sctypes
except AttributeError:
    numpy.sctypes = {
        'int': [numpy.int8, numpy.int16, numpy.int32, numpy.int64],
        'uint': [numpy.uint8, numpy.uint16, numpy.uint32, numpy.uint64],
        'float': [numpy.float16, numpy.float32, numpy.float64],
        'complex': [numpy.complex64, numpy.complex128],
        'others': [bool, object, bytes, str, numpy.void],
    }

try:
    import numpy.distutils.system_info  # noqa: F401
except Exception:
    _distutils = types.ModuleType('numpy.distutils')
    _system_info = types.ModuleType('numpy.distutils.system_info')
    _system_info.get_info = lambda name, notfound_action=0: {}
    _distutils.system_info = _system_info
    sys.modules['numpy.distutils'] = _distutils
    sys.modules['numpy.distutils.system_info'] = _system_info

try:
    import pkg_resources  # noqa: F401
except Exception:
    _pr = types.ModuleType('pkg_resources')

    class ResolutionError(Exception):
        """Stand-in for pkg_resources.ResolutionError."""

    class DistributionNotFound(ResolutionError):
        """Stand-in for pkg_resources.DistributionNotFound."""

    class VersionConflict(ResolutionError):
        """Stand-in for pkg_resources.VersionConflict."""

    def require(requirement):
        """Report every optional dependency as missing, so Chainer skips its version check."""
        raise DistributionNotFound(requirement)

    _pr.ResolutionError = ResolutionError
    _pr.DistributionNotFound = DistributionNotFound
    _pr.VersionConflict = VersionConflict
    _pr.require = require
    sys.modules['pkg_resources'] = _pr
