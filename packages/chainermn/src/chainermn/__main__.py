"""``python -m chainermn COMMAND``: run a tool of chainermn-tools (doctor, cluster, launch, trace)."""

import sys

__all__ = ['main']


def main(argv=None):
    """Run the command in ``argv`` with chainermn-tools (imported only now); return the exit status."""
    from chainermn_tools.cli import main as run_tool
    return run_tool(argv)


if __name__ == '__main__':
    sys.exit(main())
