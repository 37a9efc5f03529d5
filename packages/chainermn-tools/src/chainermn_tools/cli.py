"""Dispatch ``python -m chainermn COMMAND`` (or ``python -m chainermn_tools COMMAND``) to a tool."""

import importlib
import sys

__all__ = ['COMMANDS', 'USAGE', 'main']

#: Command -> the module whose ``main(argv)`` runs it (imported only when that command runs).
COMMANDS = {
    'doctor': 'chainermn_tools.doctor',
    'cluster': 'chainermn_tools.cluster._cli',
    'launch': 'chainermn_tools.launch',
    'trace': 'chainermn_tools.trace',
}

USAGE = ('usage: python -m chainermn doctor [--timeout SECONDS] [--no-cuda-aware-check]\n'
         '  doctor  check MPI, mpi4py, the launcher, collectives, CuPy/NCCL/GPUs and env vars\n'
         '          (also under `mpiexec -n N python -m chainermn doctor`)\n'
         '       python -m chainermn cluster --nodes N --ranks-per-node K [--link-gbit R] [--min-nodes M]\n'
         '                                   -- COMMAND ARGS...\n'
         '  cluster run an MPI job across N nodes made of Linux namespaces on this machine (root)\n'
         '  launch  run an elastic job on the hosts of a hosts file (see `launch --help`)\n'
         '       python -m chainermn trace DIR [--png PATH] [--no-png]\n'
         '  trace   report where the time of a run recorded with CHAINERMN_TRACE=DIR went\n')


def main(argv=None):
    """Run the command named by ``argv[0]`` with the rest of ``argv``; return the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ('-h', '--help', 'help'):
        sys.stdout.write(USAGE)
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        sys.stderr.write('unknown command {!r}\n{}'.format(argv[0], USAGE))
        return 2
    return importlib.import_module(COMMANDS[argv[0]]).main(argv[1:])
