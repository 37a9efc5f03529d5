"""Run one attempt of a job under Hydra ``mpiexec``: stream its output, watch its hosts, classify its end."""

import re
import subprocess
import sys
import threading
import time

from chainermn_tools.launch._hosts import kill_group, probe

__all__ = ['Attempt', 'run_attempt', 'LOADED_RE', 'FIRST_ITERATION_MARK', 'PROGRESS_ENV']

#: What the checkpointer prints on rank 0 when it loaded a generation.
LOADED_RE = re.compile(r'chainermn checkpoint: loaded generation (\d+)')
#: What the checkpointer prints on rank 0 after the first iteration of a launched job.
FIRST_ITERATION_MARK = 'chainermn checkpoint: first iteration done:'
#: File where rank 0 writes the iteration after each one (the checkpointer, under the launcher).
PROGRESS_ENV = 'CHAINERMN_LAUNCH_PROGRESS'
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

    def _write(self, lines):
        with self.lock:
            for line in lines:
                self.dst.write(line)
            self.dst.flush()

    def _end_block(self, last):
        block, self.block = self.block + [last], None
        signature = last.strip()
        with self.lock:
            if self.attempt.exception is None:
                self.attempt.exception = signature
            seen = signature in self.shown
            self.shown.add(signature)
        if seen:
            self._write(['chainermn launch: (the traceback of {} is shown above; not repeated)\n'.format(
                signature.split(':', 1)[0])])
        else:
            self._write(block)

    def run(self):
        for raw in iter(self.src.readline, b''):
            line = raw.decode(errors='replace')
            text = line.rstrip('\n')
            m = LOADED_RE.search(text)
            if m:
                self.attempt.generation = int(m.group(1))
            if FIRST_ITERATION_MARK in text and self.attempt.first_iteration_at is None:
                self.attempt.first_iteration_at = time.monotonic()
                self.attempt.first_iteration_wall = time.time()
            if self.block is not None:
                if text.startswith((' ', '\t')) or not text or text.startswith('During handling') \
                        or text.startswith('The above exception') or text == _TRACEBACK:
                    self.block.append(line)
                else:
                    self._end_block(line)
                continue
            if text.strip() == _TRACEBACK:
                self.block = [line]
                continue
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
    progress = env.get(PROGRESS_ENV)
    if progress:
        try:
            with open(progress) as f:
                attempt.last_iteration = int(f.read().strip())
        except (OSError, ValueError):
            pass
    return attempt
