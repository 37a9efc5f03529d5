"""``python -m chainermn_tools COMMAND``: the same commands as ``python -m chainermn COMMAND``."""

import sys

from chainermn_tools.cli import main

__all__ = ['main']

if __name__ == '__main__':
    sys.exit(main())
