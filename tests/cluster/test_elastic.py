"""Elastic jobs on the cluster of namespaces: ``python -m chainermn cluster --min-nodes`` (issue test 3)."""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

from chainermn_comm.testing import find_mpiexec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCH_JOB = os.path.join(ROOT, 'tests', 'elastic', 'jobs', 'launch_job.py')
MNIST = os.path.join(ROOT, 'examples', 'mnist', 'train_mnist.py')


def test_cli_min_nodes_restarts_a_preempted_job():
    res = subprocess.run([sys.executable, '-m', 'chainermn', 'cluster', '--nodes', '2', '--ranks-per-node',
                          '2', '--min-nodes', '2', '--max-restarts', '1', '--', 'python', LAUNCH_JOB,
                          'preempt'], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         timeout=300, cwd=ROOT, stdin=subprocess.DEVNULL)
    text = res.stdout + res.stderr
    assert res.returncode == 0, text
    assert 'preempted (exit status 75)' in res.stderr and 'the job finished after 1 restart(s)' in res.stderr, text
    assert res.stdout.count('finished with 4 rank(s)') == 4, text


def test_mnist_finishes_on_the_surviving_node_after_one_is_lost_for_good(make_cluster, capfd, record_figure):
    """2 nodes x 2 ranks, node-local snapshots every 5 iterations; node1 loses its link and its processes."""
    from chainermn.launch import run_on_cluster
    cluster = make_cluster(2)
    # Generation 10 is complete once every rank's file of it is on disk (each appears by os.replace)
    # and node0's completion records list it.  Waiting for node1's files alone races: node0's ranks may
    # still be writing theirs, or not have agreed yet, and the restart then rightly falls back to 5.
    snapshots = [os.path.join(cluster.nodes[rank // 2].scratch, 'ckpt', 'mnist.{}.10'.format(rank))
                 for rank in range(4)]
    lost = {}

    def recorded(rank):
        # written in the background (the default), generation 10 is complete for node0 alone once the
        # ranks agreed on it: node0's records say so (within an iteration or two of the last write)
        try:
            with open(os.path.join(cluster.nodes[0].scratch, 'ckpt', '.mnist.{}.complete'.format(rank))) as f:
                return 10 in json.load(f)['iterations']
        except (OSError, ValueError, KeyError):
            return False

    def complete():
        return all(os.path.exists(s) for s in snapshots) and recorded(0) and recorded(1)

    def lose_node1():
        deadline = time.monotonic() + 400
        while not complete() and time.monotonic() < deadline and not lost.get('stop'):
            time.sleep(0.01)   # poll for generation 10 on both nodes, as the fault tests do
        if not complete():
            return
        cluster.link_down(1)
        lost['at'] = time.time()
        lost['killed'] = cluster.kill(1)
        lost['newest'] = max([int(f.rsplit('.', 1)[1])
                              for f in os.listdir(os.path.join(cluster.nodes[0].scratch, 'ckpt'))
                              if f.startswith('mnist.0.')], default=0)

    args = argparse.Namespace(ranks_per_node=2, min_nodes=1, max_restarts=2, heartbeat=2.0,
                              probe_timeout=3.0, watchdog=60.0)
    loser = threading.Thread(target=lose_node1, daemon=True)
    loser.start()
    timer = threading.Timer(500, lambda: os.kill(os.getpid(), signal.SIGTERM))   # hard limit on hangs
    timer.start()
    try:
        status = run_on_cluster(cluster, args, ['python', MNIST, '--checkpoint', '$CHAINERMN_NODE_LOCAL/ckpt',
                                                '--checkpoint-interval', '5', '--no-progress',
                                                '--out', os.path.join(cluster.nodes[0].scratch, 'out')],
                                find_mpiexec())
    finally:
        timer.cancel()
        lost['stop'] = True
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    out, err = capfd.readouterr()
    text = out + err
    assert 'at' in lost, 'node1 was never lost: ' + text
    assert status == 0, text
    assert re.search(r'the job failed: lost host\(s\) node1', text), text
    assert 'hosts dropped: node1; added: none; starting on 1 host(s): node0' in text, text
    m = re.search(r'restart 1: generation (\d+) loaded; (\d+) iteration\(s\) redone \(the failed attempt '
                  r'reached iteration (\d+)\); training again ([0-9.]+) s after the failure '
                  r'\(first iteration at unix time ([0-9.]+)\)', text)
    assert m, text
    generation, redone, reached = int(m.group(1)), int(m.group(2)), int(m.group(3))
    assert redone == reached - generation and 0 <= redone < 5, text
    # generation 10 was complete on both nodes before node1 was lost
    assert generation >= max(lost['newest'], 10), (lost, text)
    accuracy = float(re.search(r'FINAL validation/main/accuracy=([0-9.]+) .* ranks=(\d)', out).group(1))
    assert accuracy > 0.9, text
    assert re.search(r'ranks=2 ', out), text
    again = float(m.group(5)) - lost['at']
    record_figure('elastic: node lost -> training again', again,
                  's; generation {} loaded, {} iteration(s) redone (reached {}); accuracy {:.4f}'
                  .format(generation, redone, reached, accuracy))
