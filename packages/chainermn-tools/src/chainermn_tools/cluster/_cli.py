"""``python -m chainermn cluster``: run an MPI job across nodes made of namespaces on this machine."""

import argparse
import os
import signal
import subprocess
import sys
import time

from chainermn_tools._args import count, number, seconds
from chainermn_tools.cluster._cluster import Cluster
from chainermn_tools.cluster._support import ClusterUnavailable, require_hydra
from chainermn_comm.mpirun import find_mpiexec

__all__ = ['main']

UNAVAILABLE_EXIT_STATUS = 2

_EPILOG = '''examples:
  python -m chainermn cluster --nodes 2 --ranks-per-node 1 -- python examples/mnist/train_mnist.py
  python -m chainermn cluster --nodes 2 --ranks-per-node 2 --link-gbit 1 -- python -m chainermn doctor
  python -m chainermn cluster --slurm --nodes 2 --ranks-per-node 2 -- python train.py   # via srun

Each node gets hostname nodeI, its own network (a veth to a bridge, 198.18.0.0/15), /dev/shm,
IPC, PID namespace and a node-local scratch directory ($CHAINERMN_NODE_LOCAL).  Needs root.
Exit status: the job's; 2 when the nodes cannot be made (what is missing is printed).'''


class _Stop(Exception):
    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


def _parser():
    p = argparse.ArgumentParser(
        prog='python -m chainermn cluster', epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description='Start N nodes (Linux namespaces) on this machine, run mpiexec with N x K ranks of '
                    'COMMAND across them, stream its output, remove the nodes, exit with its status.')
    p.add_argument('--nodes', type=count(1, 250), required=True, help='number of nodes (1 to 250)')
    p.add_argument('--ranks-per-node', type=count(), default=1, help='MPI ranks per node (default 1)')
    p.add_argument('--link-gbit', type=number(float, low=0, low_open=True, unit='Gbit/s'), default=None,
                   help="limit each node's link to R Gbit/s in both directions (tbf)")
    p.add_argument('--delay-ms', type=number(float, low=0, unit='milliseconds'), default=None,
                   help='link delay (needs the netem qdisc)')
    p.add_argument('--loss-pct', type=number(float, low=0, high=100, unit='percent'), default=None,
                   help='link packet loss (needs the netem qdisc)')
    p.add_argument('--timeout', type=seconds(), default=None,
                   help='kill the job after this many seconds (exit 124)')
    p.add_argument('--grace', type=seconds(low=0, low_open=False), default=30.0,
                   help='seconds the job gets to exit after SIGTERM/Ctrl-C before it is killed (default 30; '
                        'a second signal kills it at once)')
    p.add_argument('--slurm', action='store_true',
                   help='also run Slurm on the nodes (slurmctld on the head, slurmd per node; needs '
                        'slurm-wlm and munge) and start the job with `srun --mpi=pmi2` instead of mpiexec')
    elastic = p.add_argument_group('elastic job (with --min-nodes; see `python -m chainermn launch`)')
    elastic.add_argument('--min-nodes', type=count(), default=None,
                         help='restart the job on the nodes that still answer while at least M do')
    from chainermn_tools.launch import add_restart_options
    add_restart_options(elastic, heartbeat=2.0, probe_timeout=3.0)   # nodes on one machine answer fast
    p.add_argument('command', nargs=argparse.REMAINDER, help='-- COMMAND ARGS...')
    return p


def _stop_on_signals():
    def handler(signum, frame):
        raise _Stop(signum)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)


def _ignore_signals():
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)


def _wait(proc, timeout):
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def _forward(cluster, proc, signum, grace, slurm=None):
    """Pass a stop signal on to the job's ranks (as a batch system would), give it ``grace`` s; return status."""
    sig = signal.SIGTERM if signum == signal.SIGHUP else signum
    sys.stderr.write('chainermn cluster: got {}; sending {} to every rank, waiting up to {:.0f} s\n'.format(
        signal.Signals(signum).name, signal.Signals(sig).name, grace))
    if slurm is not None:
        slurm.signal_jobs(sig)
    else:
        for node in cluster.nodes:
            cluster.kill(node, sig, ranks_only=True)
    status = _wait(proc, grace)
    if status is None:
        sys.stderr.write('chainermn cluster: the job did not exit within {:.0f} s; killing it\n'.format(grace))
    return status


def run(args):
    """Build the cluster, run the job, tear down; return the exit status."""
    if args.nodes < 1 or args.ranks_per_node < 1:
        sys.stderr.write('chainermn cluster: --nodes and --ranks-per-node must be at least 1\n')
        return UNAVAILABLE_EXIT_STATUS
    command = args.command[1:] if args.command[:1] == ['--'] else args.command
    if not command:
        sys.stderr.write('chainermn cluster: give the command to run after --, e.g. '
                         '`-- python train.py`\n')
        return UNAVAILABLE_EXIT_STATUS
    if args.min_nodes is not None and args.slurm:
        sys.stderr.write('chainermn cluster: --min-nodes (elastic job, on mpiexec) does not work with --slurm yet\n')
        return UNAVAILABLE_EXIT_STATUS
    _stop_on_signals()
    cluster = Cluster(nodes=args.nodes, link_gbit=args.link_gbit, delay_ms=args.delay_ms,
                      loss_pct=args.loss_pct)
    proc = None
    status = None
    slurm = None
    try:
        try:
            if not args.slurm:
                mpiexec = find_mpiexec()
                require_hydra(mpiexec)
            cluster.start()
            if args.slurm:
                from chainermn_tools.slurm import SlurmOnCluster
                slurm = SlurmOnCluster(cluster)
                slurm.start()
        except (ClusterUnavailable, RuntimeError) as e:
            sys.stderr.write('chainermn cluster: {}\n'.format(e))
            return UNAVAILABLE_EXIT_STATUS
        sys.stderr.write('chainermn cluster: {} nodes ({}) x {} ranks on {}{}; node-local dir {}\n'.format(
            args.nodes, ', '.join('{}={}'.format(n.hostname, n.address) for n in cluster.nodes),
            args.ranks_per_node, cluster.subnet,
            '' if args.link_gbit is None else ', links {:g} Gbit/s'.format(args.link_gbit),
            cluster.node_local))
        if slurm is not None:
            sys.stderr.write('chainermn cluster: Slurm up in {:.2f} s (slurmctld on head={}); srun --mpi=pmi2\n'
                             .format(slurm.daemons.timings['total'], cluster.head_address))
            cmd, env = slurm.srun_command(command, args.ranks_per_node), slurm.env()
        else:
            cmd, env = cluster.mpiexec_command(command, args.ranks_per_node, mpiexec=mpiexec), cluster.env()
        sys.stderr.flush()
        if args.min_nodes is not None:
            from chainermn_tools.launch import run_on_cluster
            return run_on_cluster(cluster, args, command, mpiexec)
        proc = subprocess.Popen(cmd, env=env, start_new_session=True)
        try:
            status = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            sys.stderr.write('chainermn cluster: the job ran past --timeout {:g} s; killing it\n'.format(
                args.timeout))
            status = 124
        except _Stop as stop:
            try:
                status = _forward(cluster, proc, stop.signum, args.grace, slurm)
            except _Stop:
                sys.stderr.write('chainermn cluster: second signal; killing the job now\n')
                status = None
            if status is None:
                status = 128 + stop.signum
    except _Stop as stop:
        status = 128 + stop.signum
    finally:
        _ignore_signals()
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if slurm is not None:
            slurm.stop()
        cluster.close()
        if proc is not None:
            proc.wait()
    return 128 - status if status < 0 else status     # killed by a signal: the shell's 128 + N


def main(argv=None):
    """Command-line entry point; return the exit status."""
    args = _parser().parse_args(argv)
    return run(args)


if __name__ == '__main__':
    sys.exit(main())
