"""Facts each rank collects about itself before the ranks compare notes."""

import importlib
import importlib.metadata
import os
import platform
import socket
import sys

__all__ = ['SUB_PACKAGES', 'ENV_VARS', 'meta_package', 'package_facts', 'local_facts']

SUB_PACKAGES = ('chainermn_comm', 'chainermn_data', 'chainermn_links', 'chainermn_train', 'chainermn_tools')
#: Environment variables the manual and this project name.
ENV_VARS = ('MV2_USE_CUDA', 'MV2_SMP_USE_CMA', 'LD_LIBRARY_PATH', 'CHAINERMN_TIMEOUT',
            'CHAINERMN_DEBUG', 'CHAINERMN_FORCE_ABORT_ON_EXCEPTION', 'CHAINERMN_RANKS_PER_NODE',
            'CHAINERMN_THREADS')


def meta_package():
    """Return the imported ``chainermn`` meta-package, or None when it is not installed.

    The tools never depend on the meta-package (it depends on them); the doctor only looks at it.
    """
    try:
        return importlib.import_module('chainermn')
    except ImportError:
        return None


def package_facts():
    """Return {name: version or 'ERROR: ...'} for chainermn, its sub-packages, chainer and numpy."""
    chainermn = meta_package()
    out = {'chainermn': 'not installed' if chainermn is None else
           '{} ({})'.format(chainermn.__version__, os.path.dirname(chainermn.__file__))}
    for name in SUB_PACKAGES + ('chainer', 'numpy'):
        try:
            mod = importlib.import_module(name)
            version = getattr(mod, '__version__', None)
            if version is None:
                version = importlib.metadata.version(name.replace('_', '-'))
            out[name] = str(version)
        except Exception as e:
            out[name] = 'ERROR: {}: {}'.format(type(e).__name__, e)
    return out


def local_facts(rank, mpiexec_path):
    """Return this rank's facts (host, Python, packages, env vars, GPU, CPUs) as a picklable dict."""
    from chainermn_tools.doctor._cpus import cpu_facts
    from chainermn_tools.doctor._gpu import gpu_facts
    return {
        'rank': rank, 'host': socket.gethostname(), 'pid': os.getpid(),
        'python': sys.executable, 'python_version': platform.python_version(),
        'packages': package_facts(), 'mpiexec': mpiexec_path,
        'env': {k: os.environ.get(k) for k in ENV_VARS}, 'gpu': gpu_facts(), 'cpus': cpu_facts(),
    }
