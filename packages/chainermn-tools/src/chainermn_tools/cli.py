"""Dispatch ``python -m chainermn COMMAND`` (or ``python -m chainermn_tools COMMAND``) to a tool."""

import importlib
import sys

from chainermn_comm.spelling import did_you_mean

__all__ = ['COMMANDS', 'SUMMARIES', 'USAGE', 'main']

#: Command -> the module whose ``main(argv)`` runs it (imported only when that command runs).
COMMANDS = {
    'doctor': 'chainermn_tools.doctor',
    'launch': 'chainermn_tools.launch',
    'cluster': 'chainermn_tools.cluster._cli',
    'trace': 'chainermn_tools.trace',
}

#: Command -> what it does, in one line (``python -m chainermn --help``).
SUMMARIES = {
    'doctor': 'check MPI, the launcher, collectives, GPUs/NCCL and CHAINERMN_* (also under mpiexec)',
    'launch': 'run an elastic job on a hosts file or Slurm allocation; restart on the hosts left',
    'cluster': 'run an MPI job across nodes made of Linux namespaces on this machine (root)',
    'trace': 'report where the time of a run recorded with CHAINERMN_TRACE=DIR went',
}


def _usage():
    width = max(len(name) for name in COMMANDS)
    lines = ['usage: python -m chainermn COMMAND [ARGS ...]', '', 'commands:']
    lines += ['  {:<{}}  {}'.format(name, width, SUMMARIES[name]) for name in COMMANDS]
    lines += ['', "A command's usage and options: python -m chainermn COMMAND --help",
              '(e.g. python -m chainermn launch --help).']
    return '\n'.join(lines) + '\n'


USAGE = _usage()


def main(argv=None):
    """Run the command named by ``argv[0]`` with the rest of ``argv``; return the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ('-h', '--help', 'help'):
        sys.stdout.write(USAGE)
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        sys.stderr.write('python -m chainermn: unknown command {!r}.{}\n\n{}'.format(
            argv[0], did_you_mean(argv[0], COMMANDS), USAGE))
        return 2
    return importlib.import_module(COMMANDS[argv[0]]).main(argv[1:])
