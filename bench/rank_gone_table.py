"""Measure how long the other ranks take to end when one rank returns, exits, raises, is killed, freezes or is slow.

Usage (from the repo root; ``--cluster`` as root, on two nodes of namespaces, ``-n`` ranks each;
the killed rank is then every rank of node1, killed through the cluster):
    .venv/bin/python bench/rank_gone_table.py [-n 3] [--cluster] [--cases return,exit3,...]
        [--slow 75] [--out FILE.json]

Every case runs tests/faults/jobs/job_leave.py with no ``CHAINERMN_*`` variable set (the
defaults: a frozen rank takes the stall threshold plus the unresponsive limit, about 5 minutes).
Prints a Markdown table for docs/troubleshooting.md: case, seconds from the fault (the job's
``FAULT-LEAVE-AT`` stamp, the signal, or for ``slow`` the launch) to the launcher's return, exit
status, and the line the job printed about it.
"""

import argparse
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
JOB = os.path.join(ROOT, 'tests', 'faults', 'jobs', 'job_leave.py')
CASES = ('return', 'exit3', 'exit3_hook', 'raise', 'raise_hook', 'finalize', 'recv', 'kill', 'stop',
         'slow')
WHAT = {'return': 'returns from its program', 'exit3': 'calls sys.exit(3)',
        'exit3_hook': 'calls sys.exit(3), except hook on', 'raise': 'raises (no except hook)',
        'raise_hook': 'raises, except hook on', 'finalize': 'calls comm.finalize()',
        'recv': 'returns while rank 0 waits in recv from it', 'kill': 'is killed (SIGKILL)',
        'stop': 'freezes (SIGSTOP)', 'slow': 'rank 0 computes alone for {slow:g} s (slow)'}
_LINE = re.compile(r'^(chainermn: rank \d+ \(host|chainermn: \[rank \d+ host [^]]+\] (sys\.exit|uncaught)|'
                   r'YOUR APPLICATION TERMINATED)')


def _line(text):
    for line in text.splitlines():
        if _LINE.search(line):
            return line.strip()
    return ''


def run_case(case, n, slow, runner, kill_last):
    """Return {seconds, status, line} of one case; ``kill_last(pid)`` SIGKILLs the last rank."""
    from chainermn_comm.protocol import VARIABLES
    env = {name: None for name in VARIABLES}
    tmp = tempfile.mkdtemp(prefix='rank-gone-')
    args = [JOB, case]
    killed = {}
    on_start = None
    if case == 'kill':
        args.append(tmp)

        def on_start(proc):
            path = os.path.join(tmp, 'pid')
            while not os.path.exists(path) and proc.poll() is None:
                time.sleep(0.01)
            if os.path.exists(path):
                killed['at'] = time.time()
                kill_last(int(open(path).read()))
    elif case == 'slow':
        args.append(str(slow))
    started = time.time()
    try:
        res = runner(args, n, env, on_start)
        end = time.time()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    m = re.search(r'FAULT-LEAVE-AT=([0-9.]+)', res.stderr)
    t0 = killed.get('at') or (float(m.group(1)) if m and case != 'slow' else started)
    return {'seconds': end - t0, 'status': res.returncode, 'timed_out': res.timed_out,
            'line': _line(res.stderr + '\n' + res.stdout), 'from': 'launch' if case == 'slow' else 'fault'}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('-n', type=int, default=3, help='ranks (per node with --cluster)')
    p.add_argument('--cluster', action='store_true', help='on 2 nodes of a namespace cluster')
    p.add_argument('--cases', default=','.join(CASES))
    p.add_argument('--slow', type=float, default=75.0, help='seconds rank 0 computes alone in "slow"')
    p.add_argument('--out', default=None)
    args = p.parse_args(argv)
    cluster = None

    def stop(signum, frame):
        raise SystemExit(128 + signum)  # SIGTERM: remove the cluster on the way out

    signal.signal(signal.SIGTERM, stop)
    if args.cluster:
        from chainermn_tools.cluster import Cluster
        cluster = Cluster(nodes=2).start()

        def runner(a, n, env, on_start):
            return cluster.mpiexec(a, ranks_per_node=n, timeout=600, env=env, on_start=on_start)

        def kill_last(pid):  # the pid is the node's own: kill the job's ranks of node1 instead
            cluster.kill(1, signal.SIGKILL, ranks_only=True)
    else:
        from chainermn_comm.testing import run_mpi

        def runner(a, n, env, on_start):
            return run_mpi(a, n, timeout=600, env=env, on_start=on_start)

        def kill_last(pid):
            os.kill(pid, signal.SIGKILL)
    rows = {}
    try:
        for case in args.cases.split(','):
            rows[case] = run_case(case, args.n, args.slow, runner, kill_last)
            r = rows[case]
            print('{:<11s} {:7.1f} s  status {:>3}  {}'.format(case, r['seconds'], r['status'], r['line']),
                  flush=True)
    finally:
        if cluster is not None:
            cluster.close()
    where = '2 nodes x {} ranks'.format(args.n) if args.cluster else '{} ranks, one host'.format(args.n)
    print('\n| the last rank ... ({}) | the others end after | exit status | what the job prints |'.format(where))
    print('|---|---|---|---|')
    for case, r in rows.items():
        print('| {} | {:.1f} s{} | {} | `{}` |'.format(WHAT[case].format(slow=args.slow), r['seconds'],
                                                    ' (from launch; finishes)' if case == 'slow' else '',
                                                    r['status'], r['line'].replace('|', '\\|')))
    if args.out:
        with open(args.out, 'w') as f:
            json.dump({'command': ' '.join(sys.argv), 'where': where, 'rows': rows}, f, indent=1)
    return 0


if __name__ == '__main__':
    sys.exit(main())
