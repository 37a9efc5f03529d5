"""chainermn-tools: ``doctor``, ``launch``, ``cluster``, ``trace`` and ``slurm`` (``python -m chainermn COMMAND``).

The tools sit above the libraries: they use ``chainermn_comm`` through its public names, and no
library package imports them.  Each tool is a subpackage, imported only when it is used;
``chainermn_tools.cli.main`` dispatches the commands.
"""

from chainermn_tools._version import __version__

__all__ = ['__version__']
