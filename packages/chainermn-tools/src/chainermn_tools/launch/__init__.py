"""``python -m chainermn launch``: run an elastic job on the hosts of a hosts file with Hydra ``mpiexec``.

The job runs as ``mpiexec -hosts H1,H2,.. -ppn K -n K*len(hosts) -bind-to core COMMAND``: each rank on a
core of its own (``--bind-to``; by default only where every host has at least K CPUs, as its probe
counts them, else unbound).  Before every start, and when it fails, every host of the (re-read) hosts
file is probed with ``mpiexec -hosts HOST -n 1 nproc`` under a time limit (through the same
launcher); the job restarts on the hosts that answer if at least ``--min-nodes`` do (when fewer
do, every host is probed again for up to ``--rejoin-wait`` seconds) and restarts are left, and
resumes from its newest usable snapshot (the multi-node checkpointer takes care of a different
number of ranks).  While the job runs, its hosts are probed every
``--heartbeat`` seconds; a host that stops answering ends the attempt.  The job runs with the
watchdog on (``CHAINERMN_TIMEOUT``, default ``--watchdog``), so ranks blocked on a vanished peer end,
and with the global except hook on (``CHAINERMN_FORCE_ABORT_ON_EXCEPTION=1``), so an exception on one
rank ends the attempt.
Inside a Slurm allocation (``SLURM_JOB_NODELIST`` set) without ``--hosts-file``, the hosts are the
allocation's nodes (``scontrol show hostnames``, asked again before every start) and
``--ranks-per-node`` defaults to Slurm's tasks per node.
Preemption (exit status 75) is a failure to restart from.  The same exception twice in a row, or
``--max-restarts`` restarts, ends the launch with the job's status.
"""

import argparse
import os
import shutil
import signal
import sys
import tempfile
import threading
import time

from chainermn_comm import protocol
from chainermn_tools._args import count, number, seconds
from chainermn_tools.launch import _attempt, _hosts, _slurm

__all__ = ['main', 'supervise', 'job_env', 'run_on_cluster', 'add_restart_options', 'PREEMPTED_STATUS',
           'WATCHDOG_STATUS']

PREEMPTED_STATUS = protocol.PREEMPTED_EXIT_STATUS
WATCHDOG_STATUS = protocol.WATCHDOG_EXIT_STATUS
_LOG = 'chainermn launch: '


def _log(msg):
    sys.stderr.write(_LOG + msg + '\n')
    sys.stderr.flush()


def add_restart_options(parser, heartbeat=5.0, probe_timeout=10.0):
    """Add --max-restarts, --heartbeat, --probe-timeout and --watchdog to ``parser`` (or a group)."""
    parser.add_argument('--max-restarts', type=count(0), default=3,
                        help='restarts allowed in all (default 3)')
    parser.add_argument('--heartbeat', type=seconds(off=0), default=heartbeat,
                        help='seconds between probes of the job\'s hosts while it runs (0: off; default '
                             '{:g})'.format(heartbeat))
    parser.add_argument('--probe-timeout', type=seconds(), default=probe_timeout,
                        help='seconds a host may take to run the probe (default {:g})'.format(probe_timeout))
    parser.add_argument('--rejoin-wait', type=seconds(off=0), default=60.0,
                        help='at a restart with fewer than --min-nodes hosts answering, probe every host '
                             'again (lost ones too) for up to this many seconds before giving up (a link '
                             'that went down for a while comes back; default 60; 0: give up at once)')
    parser.add_argument('--watchdog', type=number(float, low=1, off=0, unit='seconds'), default=60.0,
                        help='CHAINERMN_TIMEOUT for the job when the environment sets none (default 60; '
                             '0: off)')


def add_bind_option(parser):
    """Add --bind-to (auto, core, none) to ``parser``."""
    parser.add_argument('--bind-to', choices=('auto', 'core', 'none'), default='auto',
                        help='bind each rank to a core of its own (mpiexec -bind-to core); auto (the '
                             'default): when every host has at least --ranks-per-node CPUs')


def _binding(args, healthy, cpus):
    """Return the Hydra options that bind this attempt's ranks, and a note for the log."""
    mode = getattr(args, 'bind_to', 'auto')
    short = [h for h in healthy if cpus.get(h, 0) < args.ranks_per_node]
    if mode == 'none' or (mode == 'auto' and short):
        why = '' if mode == 'none' else ' ({} has fewer CPUs than --ranks-per-node {})'.format(
            ', '.join('{}: {}'.format(h, cpus.get(h, '?')) for h in short), args.ranks_per_node)
        return [], '; ranks not bound to cores' + why
    return ['-bind-to', 'core'], '; one core per rank (-bind-to core)'


def _parser():
    p = argparse.ArgumentParser(prog='python -m chainermn launch', description=__doc__.split('\n')[0],
                                usage='python -m chainermn launch [--hosts-file FILE] [--ranks-per-node K] '
                                      '--min-nodes M [--max-restarts R] [options] -- COMMAND ...')
    p.add_argument('--hosts-file', default=None,
                   help='one host per line (re-read before every start); default inside a Slurm '
                        'allocation: its nodes (scontrol show hostnames $SLURM_JOB_NODELIST)')
    p.add_argument('--ranks-per-node', type=count(), default=None,
                   help='ranks started on every host; default inside a Slurm allocation: '
                        'SLURM_NTASKS_PER_NODE, else the fewest of SLURM_TASKS_PER_NODE')
    p.add_argument('--min-nodes', type=count(), required=True, help='fewest healthy hosts to (re)start on')
    p.add_argument('--max-nodes', type=count(), default=None, help='most hosts to start on (default: all)')
    add_restart_options(p)
    p.add_argument('--mpiexec', default=None, help='Hydra mpiexec to use (default: next to python, else PATH)')
    p.add_argument('--launcher-exec', default=None,
                   help='program Hydra runs instead of ssh to reach a host (mpiexec -launcher-exec)')
    add_bind_option(p)
    p.add_argument('command', nargs=argparse.REMAINDER, help='the job, after --')
    return p


def _find_mpiexec():
    here = os.path.join(os.path.dirname(sys.executable), 'mpiexec')
    if os.access(here, os.X_OK):
        return here
    return shutil.which('mpiexec') or 'mpiexec'


def _check(args, parser):
    command = args.command[1:] if args.command[:1] == ['--'] else args.command
    if not command:
        parser.error('give the job after --, e.g. -- python train.py')
    in_slurm = args.hosts_file is None and _slurm.nodelist(os.environ) is not None
    if args.hosts_file is None and not in_slurm:
        parser.error('no --hosts-file given and not inside a Slurm allocation (neither SLURM_JOB_NODELIST '
                     'nor SLURM_NODELIST is set): pass --hosts-file FILE, or run inside salloc/sbatch')
    if args.ranks_per_node is None:
        args.ranks_per_node = _slurm.ranks_per_node(os.environ) if in_slurm else None
        if args.ranks_per_node is None:
            parser.error('give --ranks-per-node K' + (' (Slurm sets neither SLURM_NTASKS_PER_NODE nor '
                                                      'SLURM_TASKS_PER_NODE)' if in_slurm else ''))
    for name in ('ranks_per_node', 'min_nodes'):
        if getattr(args, name) < 1:
            parser.error('--{} must be at least 1'.format(name.replace('_', '-')))
    if args.max_restarts < 0:
        parser.error('--max-restarts must be 0 or more')
    if args.hosts_file is not None and not os.path.isfile(args.hosts_file):
        parser.error('hosts file {} does not exist'.format(args.hosts_file))
    return command


def _classify(att):
    if att.lost:
        return 'lost host(s) {}'.format(', '.join('{} ({})'.format(h, d) for h, d in att.lost.items()))
    if att.status == PREEMPTED_STATUS:
        return 'preempted (exit status 75)'
    if att.status == WATCHDOG_STATUS:
        return 'watchdog ended it (exit status 14: a rank was blocked too long)'
    if att.exception:
        return 'exit status {} after {}'.format(att.status, att.exception)
    return 'exit status {}'.format(att.status)


class _Stop:
    """SIGTERM/SIGINT to the launcher: pass SIGTERM to the job and do not restart."""

    def __init__(self):
        self.requested = False
        self.proc = None

    def started(self, proc):
        self.proc = proc
        if self.requested:
            self(signal.SIGTERM, None)

    def __call__(self, signum, frame):
        self.requested = True
        _log('got signal {}; passing SIGTERM to the job, no restart'.format(signum))
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except (ProcessLookupError, PermissionError):
                pass


def job_env(args, env=None):
    """Return the environment of an elastic job: watchdog and except hook on, restart marks."""
    env = dict(os.environ if env is None else env)
    env.setdefault(protocol.TIMEOUT_ENV, '{:g}'.format(args.watchdog))
    env.setdefault(protocol.RANKS_PER_NODE_ENV, str(args.ranks_per_node))
    env.setdefault(protocol.FORCE_ABORT_ENV, '1')   # one rank's exception ends the attempt
    env[protocol.ELASTIC_ENV] = '1'
    return env


def main(argv=None):
    """Command-line entry point; return the exit status (0: the job finished)."""
    parser = _parser()
    args = parser.parse_args(argv)
    command = _check(args, parser)
    base = _hosts.mpiexec_base(args.mpiexec or _find_mpiexec(), args.launcher_exec)
    if args.hosts_file is None:
        env = dict(os.environ)
        return supervise(args, command, base, job_env(args), lambda: _slurm.allocation_hosts(env),
                         'the Slurm allocation {}'.format(_slurm.nodelist(env)))
    return supervise(args, command, base, job_env(args), lambda: _hosts.read_hosts(args.hosts_file),
                     'the hosts file {}'.format(args.hosts_file))


def run_on_cluster(cluster, args, command, mpiexec):
    """Run an elastic job on a started ``Cluster`` (``python -m chainermn cluster --min-nodes M``).

    The nodes are the hosts; Hydra reaches them through the cluster's launcher program, so a node
    whose link is down fails its probe.  After every attempt, what is left of it on the nodes is killed.
    """
    from chainermn_tools.cluster._cluster import NODE_LOCAL_ENV
    args.max_nodes = None
    # The nodes share this machine's CPUs: each node's proxy would bind its ranks to the same ones.
    args.bind_to = 'none'
    base = [mpiexec, '-launcher', 'ssh', '-launcher-exec', cluster.launcher, '-localhost',
            cluster.head_address, '-genv', NODE_LOCAL_ENV, cluster.node_local]

    def clean():
        for node in cluster.nodes:
            cluster.kill(node)

    return supervise(args, command, base, job_env(args, cluster.env()), lambda: list(cluster.hostnames),
                     'the cluster', after_attempt=clean)


def supervise(args, command, base, env, read_hosts, source, after_attempt=None):
    """Run ``command`` under ``base`` (Hydra argv start) on the healthy hosts of ``read_hosts()``; restart.

    ``args`` carries ranks_per_node, min_nodes, max_nodes, max_restarts, heartbeat and probe_timeout;
    ``source`` names where the hosts come from; ``after_attempt()`` runs after every attempt (e.g. to
    clean the nodes).  Returns the exit status (0: the job finished).
    """
    workdir = tempfile.mkdtemp(prefix='chainermn-launch-')
    try:
        return _loop(args, command, base, env, read_hosts, source, after_attempt,
                     os.path.join(workdir, 'progress'))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _rejoin(args, base, known, healthy, env, cpus, stop):
    """Probe every host again (lost ones too) until --min-nodes answer or --rejoin-wait passes."""
    wait = getattr(args, 'rejoin_wait', 60.0)
    deadline = time.monotonic() + wait
    if wait > 0:
        _log('{} of {} host(s) answer, fewer than --min-nodes {}: probing every host again for up to '
             '{:g} s (--rejoin-wait)'.format(len(healthy), len(known), args.min_nodes, wait))
    while len(healthy) < args.min_nodes and not stop.requested and time.monotonic() < deadline:
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        answers = _hosts.probe(base, known, args.probe_timeout, env, cpus)
        back = [h for h in known if answers[h][0] and h not in healthy]
        if back:
            _log('host(s) {} answer again'.format(', '.join(back)))
        healthy = [h for h in known if answers[h][0]]
    return healthy


def _loop(args, command, base, env, read_hosts, source, after_attempt, progress):
    stop = _Stop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    shown, lock = set(), threading.Lock()
    restarts, previous, last_exception, failure, lost, reached = 0, None, None, None, {}, None
    status = 1
    while True:
        try:
            known = read_hosts()
        except OSError as e:
            if previous is None:
                _log('cannot read {}: {}'.format(source, e))
                return 1
            _log('cannot re-read {} ({}); probing the last hosts again'.format(source, e))
            known = list(previous)
        if not known:
            _log('{} names no host'.format(source))
            return status if previous is not None else 1
        # hosts that stopped answering during the attempt are left out of this start (not probed again)
        cpus = {}
        answers = _hosts.probe(base, [h for h in known if h not in lost], args.probe_timeout, env, cpus)
        answers.update({h: (False, 'stopped answering during the job: ' + d) for h, d in lost.items()
                        if h in known})
        healthy = [h for h in known if answers[h][0]]
        for h in known:
            if not answers[h][0]:
                _log('host {} left out: {}'.format(h, answers[h][1]))
        if previous is not None and len(healthy) < args.min_nodes:
            healthy = _rejoin(args, base, known, healthy, env, cpus, stop)
        if args.max_nodes:
            healthy = healthy[:args.max_nodes]
        if previous is not None:
            dropped = [h for h in previous if h not in healthy]
            added = [h for h in healthy if h not in previous]
            _log('restart {}: hosts dropped: {}; added: {}; starting on {} host(s): {}'.format(
                restarts, ', '.join(dropped) or 'none', ', '.join(added) or 'none', len(healthy),
                ', '.join(healthy)))
        if len(healthy) < args.min_nodes:
            _log('only {} of the {} host(s) of {} answer; --min-nodes is {}: giving up'.format(
                len(healthy), len(known), source, args.min_nodes))
            return status if previous is not None else 1
        env[protocol.LAUNCH_RESTARTS_ENV] = str(restarts)
        env[_attempt.PROGRESS_ENV] = progress
        try:
            os.remove(progress)
        except OSError:
            pass
        bind, note = _binding(args, healthy, cpus)
        _log('starting {} rank(s) on {}{}'.format(args.ranks_per_node * len(healthy), ', '.join(healthy),
                                                  note))
        att = _attempt.run_attempt(base + bind, healthy, args.ranks_per_node, command, env, args.heartbeat,
                                   args.probe_timeout, shown, lock, on_start=stop.started)
        if after_attempt is not None:
            after_attempt()
        if failure is not None:
            redone = ''
            if reached is not None:
                # the attempt saved the generation it is loaded from, so it reached at least that
                # iteration, even when it died before rank 0 reported the iteration (the status file
                # is written after the snapshot)
                reached_at = max(reached, att.generation or 0)
                redone = '; {} iteration(s) redone (the failed attempt reached iteration {})'.format(
                    reached_at - (att.generation or 0), reached_at)
            if att.first_iteration_at is not None:
                _log('restart {}: generation {} loaded{}; training again {:.1f} s after the failure '
                     '(first iteration at unix time {:.3f})'.format(
                         restarts, att.generation if att.generation is not None else 'none', redone,
                         att.first_iteration_at - failure, att.first_iteration_wall))
            else:
                _log('restart {}: generation {} loaded{}; no iteration finished'.format(
                    restarts, att.generation if att.generation is not None else 'none', redone))
        # the launcher's status: the job's, 128 + N when mpiexec died of signal N, 1 for a lost host
        status = 128 - att.status if att.status < 0 else att.status
        if att.lost and status in (0, 128 + signal.SIGKILL):
            status = 1
        if att.status == 0 and not att.lost:
            _log('the job finished after {} restart(s)'.format(restarts))
            return 0
        reason = _classify(att)
        _log('the job failed: {}'.format(reason))
        if stop.requested:
            return status or 1
        exception = att.exception if not att.lost and att.status not in (
            PREEMPTED_STATUS, WATCHDOG_STATUS) else None
        if exception is not None and exception == last_exception:
            _log('the same exception twice in a row ({}); not restarting: fix the job'.format(exception))
            return status or 1
        if restarts >= args.max_restarts:
            _log('{} restart(s) used (--max-restarts {}); not restarting'.format(restarts, args.max_restarts))
            return status or 1
        last_exception = exception
        restarts += 1
        failure = att.failed_at
        previous = healthy
        lost = dict(att.lost)
        reached = att.last_iteration
