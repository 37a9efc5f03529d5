"""``chainermn.doctor``, ``.cluster``, ``.slurm``, ``.launch``: the modules of chainermn-tools under their old names.

A meta-path finder maps ``chainermn.TOOL[.sub]`` to the very module object of
``chainermn_tools.TOOL[.sub]`` (not a second copy), and only when it is first imported.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys

__all__ = ['TOOLS', 'install']

TOOLS = ('cluster', 'doctor', 'launch', 'slurm')


class _AliasLoader(importlib.abc.Loader):
    """Loader that hands back the already-imported target module."""

    def __init__(self, target):
        self.target = target
        self._spec = None

    def create_module(self, spec):
        module = importlib.import_module(self.target)
        self._spec = module.__spec__
        return module

    def exec_module(self, module):
        # Why: the import system stamps the alias spec on the module; keep the module's own.
        module.__spec__ = self._spec


class _ToolsFinder(importlib.abc.MetaPathFinder):
    """Resolve ``chainermn.TOOL`` and its submodules to ``chainermn_tools.TOOL``."""

    _chainermn_tools_alias = True

    def find_spec(self, fullname, path=None, target=None):
        parts = fullname.split('.')
        if len(parts) < 2 or parts[0] != 'chainermn' or parts[1] not in TOOLS:
            return None
        target_name = 'chainermn_tools.' + '.'.join(parts[1:])
        try:
            if importlib.util.find_spec(target_name) is None:
                return None
        except ModuleNotFoundError:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(target_name),
                                               is_package='.' not in fullname[len('chainermn.'):])


def install():
    """Put the finder on ``sys.meta_path`` once, just before PathFinder; import no tool yet.

    Before PathFinder, or ``chainermn.cluster._net`` would load a second copy of the file from
    ``chainermn_tools.cluster.__path__``; after the import-precedence finder, which stays first.
    """
    if any(getattr(f, '_chainermn_tools_alias', False) for f in sys.meta_path):
        return
    spot = next((i for i, f in enumerate(sys.meta_path) if f is importlib.machinery.PathFinder),
                len(sys.meta_path))
    sys.meta_path.insert(spot, _ToolsFinder())
