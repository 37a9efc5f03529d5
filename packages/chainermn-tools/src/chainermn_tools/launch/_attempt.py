"""Run one attempt of a job under Hydra ``mpiexec``: stream its output, watch its hosts, classify its end."""

import subprocess
import sys
import threading
import time

from chainermn_comm.launch_status import read_launch_status
from chainermn_comm.protocol import LAUNCH_STATUS_ENV
from chainermn_tools.launch._hosts import kill_group, probe

__all__ = ['Attempt', 'run_attempt', 'PROGRESS_ENV']

#: The launch status file the checkpointer keeps on rank 0 (chainermn_comm.protocol).
PROGRESS_ENV = LAUNCH_STATUS_ENV
_TRACEBACK = 'Traceback (most recent call last):'


class Attempt:
    """What happened in one attempt (status, exception line, generation, times, lost hosts)."""

    def __init__(self, hosts):
        self.hosts = list(hosts)
        self.status = None
        self.exception = None
        self.generation = None
        self.first_iteration_at = None
        self.first_iteration_wall = None
        self.failed_at = None
        self.lost = {}
        self.last_iteration = None


class _Pump(threading.Thread):
    """Copy a stream line by line; show each distinct traceback once; note the job's markers."""

    def __init__(self, src, dst, attempt, shown, lock):
        super().__init__(daemon=True)
        self.src, self.dst, self.attempt, self.shown, self.lock = src, dst, attempt, shown, lock
        self.block = None
        self.ignored = False   # the block is Python's 'Exception ignored in ...' report, not a failure

    def _write(self, lines):
        with self.lock:
            for line in lines:
                self.dst.write(line)
            self.dst.flush()

    def _end_block(self, last):
        block, self.block = self.block + [last], None
        signature = last.strip()
        with self.lock:
            if self.attempt.exception is None and not self.ignored:
                self.attempt.exception = signature
            seen = signature in self.shown
            self.shown.add(signature)
        if seen:
            self._write(['chainermn launch: (the traceback of {} is shown above; not repeated)\n'.format(
                signature.split(':', 1)[0])])
        else:
            self._write(block)

    def run(self):
        prev = ''
        for raw in iter(self.src.readline, b''):
            line = raw.decode(errors='replace')
            text = line.rstrip('\n')
            if self.block is not None:
                if text.startswith((' ', '\t')) or not text or text.startswith('During handling') \
                        or text.startswith('The above exception') or text == _TRACEBACK:
                    self.block.append(line)
                else:
                    self._end_block(line)
                    prev = text
                continue
            if text.strip() == _TRACEBACK:
                self.block = [line]
                self.ignored = prev.startswith('Exception ignored')
                continue
            prev = text
            self._write([line])
        if self.block:
            self._write(self.block)


def _heartbeat(base, hosts, every, timeout, env, proc, attempt, done):
    while not done.wait(every):
        status = probe(base, hosts, timeout, env)
        lost = {h: d for h, (ok, d) in status.items() if not ok}
        if lost and not done.is_set():
            attempt.lost = lost
            attempt.failed_at = time.monotonic()
            kill_group(proc)
            return


def run_attempt(base, hosts, ranks_per_node, command, env, heartbeat, probe_timeout, shown, lock,
                on_start=None):
    """Run ``command`` on ``hosts`` (``ranks_per_node`` each) under ``base`` (Hydra); return an Attempt."""
    attempt = Attempt(hosts)
    cmd = base + ['-hosts', ','.join(hosts), '-ppn', str(ranks_per_node),
                  '-n', str(ranks_per_node * len(hosts))] + list(command)
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, start_new_session=True)
    if on_start is not None:
        on_start(proc)
    pumps = [_Pump(proc.stdout, sys.stdout, attempt, shown, lock),
             _Pump(proc.stderr, sys.stderr, attempt, shown, lock)]
    for p in pumps:
        p.start()
    done = threading.Event()
    watcher = None
    if heartbeat > 0:
        watcher = threading.Thread(target=_heartbeat, daemon=True, args=(
            base, hosts, heartbeat, probe_timeout, env, proc, attempt, done))
        watcher.start()
    try:
        attempt.status = proc.wait()
    finally:
        done.set()
        kill_group(proc)
    if attempt.failed_at is None:
        attempt.failed_at = time.monotonic()
    for p in pumps:
        p.join(10)
    if env.get(PROGRESS_ENV):
        _read_status(attempt, read_launch_status(env[PROGRESS_ENV]))
    return attempt


def _read_status(attempt, status):
    """Note what the job's launch status file says: generation loaded, first iteration, last iteration."""
    generation, wall, iteration = (status.get(k) for k in ('generation', 'first_iteration_wall', 'iteration'))
    if isinstance(generation, int):
        attempt.generation = generation
    if isinstance(iteration, int):
        attempt.last_iteration = iteration
    if isinstance(wall, (int, float)):
        attempt.first_iteration_wall = float(wall)
        # the same instant on the monotonic clock the launcher measures failures with
        attempt.first_iteration_at = time.monotonic() - (time.time() - wall)
