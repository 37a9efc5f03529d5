"""``python -m chainermn doctor``: check the MPI/GPU set-up (see chainermn.doctor)."""

import sys

__all__ = ['main']

_USAGE = ('usage: python -m chainermn doctor [--timeout SECONDS] [--no-cuda-aware-check]\n'
          '  doctor  check MPI, mpi4py, the launcher, collectives, CuPy/NCCL/GPUs and env vars\n'
          '          (also under `mpiexec -n N python -m chainermn doctor`)\n'
          '       python -m chainermn cluster --nodes N --ranks-per-node K [--link-gbit R] [--min-nodes M]\n'
          '                                   -- COMMAND ARGS...\n'
          '  cluster run an MPI job across N nodes made of Linux namespaces on this machine (root)\n'
          '  launch  run an elastic job on the hosts of a hosts file (see `launch --help`)\n')


def main(argv=None):
    """Dispatch the sub-command; return the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ('-h', '--help', 'help'):
        sys.stdout.write(_USAGE)
        return 0 if argv else 2
    if argv[0] == 'doctor':
        from chainermn.doctor import main as doctor_main
        return doctor_main(argv[1:])
    if argv[0] == 'cluster':
        from chainermn.cluster._cli import main as cluster_main
        return cluster_main(argv[1:])
    if argv[0] == 'launch':
        from chainermn.launch import main as launch_main
        return launch_main(argv[1:])
    sys.stderr.write('unknown command {!r}\n{}'.format(argv[0], _USAGE))
    return 2


if __name__ == '__main__':
    sys.exit(main())
