"""The chaos run: faults injected into an elastic job, which must end bit for bit like a run without.

Usage (as root, from the repo root):
    .venv/bin/python bench/chaos_run.py [--minutes 10] [--faults 10] [--seed 0]
        [--kinds kill,kill-write,stop,link,disk] [--pace 0.25] [--cp-every 20] [--json FILE]

On a cluster of namespaces (``chainermn.cluster.Cluster``: 2 nodes, 2 ranks each) the job
``bench/chaos_job.py`` (an MLP with Adam, the multi-node optimizer and
``create_multi_node_checkpointer(..., background=True)`` saving every ``--cp-every`` iterations)
runs twice under ``python -m chainermn launch``: first without faults and without pacing (the
reference), then paced (``--pace`` seconds per iteration, so that it lasts ``--minutes``) while
``--faults`` faults are injected at random times drawn from ``--seed``, each kind in turn:

  kill        SIGKILL of a random rank at a random moment (the launcher restarts the job);
  kill-write  SIGKILL of a random rank while its background thread writes its next snapshot
              (the checkpointer's own kill points: mid-write, before or after the rename);
  stop        SIGSTOP of a random rank for ``--stop-seconds`` (30), then SIGCONT: a slow rank is
              never killed, the job goes on;
  link        a random node's link down for ``--link-seconds`` (10), then up again;
  disk        the checkpoint directory (a tmpfs of ``--disk-mb``) filled until one save fails,
              then freed: the save is reported, training goes on, the next save succeeds.

A fault waits until the job trains again after the previous one and has saved a generation
since.  The watchdog is set so that a stopped rank cannot be taken for a hung one: the launcher
gets ``--watchdog`` (CHAINERMN_TIMEOUT, default 120 s: four times the longest stop) and the stall
report / unresponsive limits keep their defaults (60 s / 240 s, both above the stop).

At the end the final parameters and optimizer state of every rank are compared byte for byte with
the reference's, and a table is printed: each fault, when, the restarts it caused, the generation
resumed from, the iterations redone and the seconds lost (time from the fault until the job is
back at the iteration it had reached, less what those iterations take without faults).  A
restart that loads another generation than the newest one every rank had written when the job
failed counts as a generation lost.  Exit status 0 when the verdict is PASS.  Everything made
(nodes, links, the tmpfs, the work directory) is removed at the end, also when the run fails.
"""

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
JOB = os.path.join(HERE, 'chaos_job.py')

__all__ = ['KINDS', 'WRITE_POINTS', 'schedule', 'differing_bits', 'main']

KINDS = ('kill', 'kill-write', 'stop', 'link', 'disk')
#: The kill points of a background save a ``kill-write`` fault picks from: all inside the write
#: thread (the other points of a save, around the copy and the agreement, are the crash tests').
WRITE_POINTS = ('mid-write', 'before-rename', 'after-rename')
NODES, PER_NODE = 2, 2
SIZE = NODES * PER_NODE
_RESTART = re.compile(r'chainermn launch: restart (\d+): generation (\S+) loaded'
                      r'(?:; (\d+) iteration\(s\) redone \(the failed attempt reached iteration (\d+)\))?'
                      r'; (?:training again ([0-9.]+) s after the failure|no iteration finished)')
_FAILED = re.compile(r'chainermn launch: the job failed: (.*)')
_SAVE_FAILED = re.compile(r'the save of iteration (\d+) failed on rank')
_RESUMED = re.compile(r'CHAOS-RESUMED rank=0 iteration=(\d+) loaded=(\S+)')


def _say(msg):
    sys.stderr.write('[chaos {}] {}\n'.format(time.strftime('%H:%M:%S'), msg))
    sys.stderr.flush()


def schedule(kinds, faults, start, end, seed):
    """Return ``[(seconds, kind, rng)]``: ``faults`` faults at seeded random times in [start, end).

    The kinds come in turn (each one as often as the others, in an order the seed shuffles); each
    fault lies at a random point of the first 60% of its own slot of the window.
    """
    rng = random.Random(seed)
    order = []
    while len(order) < faults:
        block = list(kinds)
        rng.shuffle(block)
        order += block
    slot = (end - start) / float(faults)
    return [(start + k * slot + rng.uniform(0, 0.6 * slot), order[k], random.Random(rng.random()))
            for k in range(faults)]


def differing_bits(a, b):
    """Return the number of bits that differ between two arrays of the same dtype and shape."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return max(a.nbytes, b.nbytes) * 8
    x = numpy.frombuffer(numpy.ascontiguousarray(a).tobytes(), numpy.uint8)
    y = numpy.frombuffer(numpy.ascontiguousarray(b).tobytes(), numpy.uint8)
    return int(numpy.unpackbits(x ^ y).sum())


class Output(threading.Thread):
    """Read the launcher's output; keep every line with its time; echo the launcher's and ours."""

    def __init__(self, proc, log_path, on_line=None):
        super().__init__(daemon=True)
        self.proc, self.lines, self.on_line = proc, [], on_line
        self.cond = threading.Condition()
        self.log = open(log_path, 'a')

    def run(self):
        for raw in iter(self.proc.stdout.readline, b''):
            line = raw.decode(errors='replace').rstrip('\n')
            now = time.monotonic()
            if self.on_line is not None:
                self.on_line(line)
            with self.cond:
                self.lines.append((now, line))
                self.cond.notify_all()
            self.log.write('{:.3f} {}\n'.format(time.time(), line))
            self.log.flush()
            if line.startswith(('chainermn launch:', 'CHAOS-ARMED')) or 'failed on rank' in line:
                sys.stderr.write('    | ' + line + '\n')
                sys.stderr.flush()
        self.log.close()

    def wait_for(self, pattern, since, timeout):
        """Return ``(index, time, match)`` of the first line from ``since`` matching, or None."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for i in range(since, len(self.lines)):
                    m = pattern.search(self.lines[i][1])
                    if m:
                        return i, self.lines[i][0], m
                since = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self.is_alive()):
                    return None
                self.cond.wait(min(left, 0.5))

    def since(self, index):
        with self.cond:
            return list(self.lines[index:])


class Run:
    """One job under ``python -m chainermn launch`` on the cluster, and what the driver sees of it."""

    def __init__(self, bench, tag, pace, ckpt, max_restarts):
        self.bench, self.tag = bench, tag
        self.progress_path = os.path.join(bench.work, 'progress.' + tag)
        self.ckpt = ckpt
        #: (time, reason, newest generation every rank had on disk, iteration reached)
        self.failures = []
        self.resumes = []    # (time, generation loaded or None)
        cmd = [sys.executable, '-m', 'chainermn', 'launch', '--hosts-file', bench.hosts,
               '--ranks-per-node', str(PER_NODE), '--min-nodes', str(NODES),
               '--max-restarts', str(max_restarts), '--heartbeat', repr(bench.args.heartbeat),
               '--probe-timeout', repr(bench.args.probe_timeout), '--watchdog', repr(bench.args.watchdog),
               '--bind-to', 'none',   # the nodes share this machine's cores
               '--mpiexec', bench.mpiexec, '--launcher-exec', bench.cluster.launcher, '--',
               'python', JOB, bench.work, str(bench.iterations), '--ckpt', ckpt,
               '--cp-every', str(bench.args.cp_every), '--pace', repr(pace), '--tag', tag,
               '--seed', str(bench.args.seed)]
        env = bench.cluster.env({'PYTHONUNBUFFERED': '1', 'CHAINERMN_TIMEOUT': None})
        self.started = time.monotonic()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.out = Output(self.proc, os.path.join(bench.work, 'log.' + tag), self._on_line)
        self.out.start()

    def _on_line(self, line):
        m = _FAILED.search(line)
        if m:   # before the restart loads: what should it load?
            p = self.progress()
            self.failures.append((time.monotonic(), m.group(1), newest_complete(self.ckpt),
                                  p[0] if p else None))
        m = _RESUMED.search(line)
        if m:
            self.resumes.append((time.monotonic(), None if m.group(2) == 'None' else int(m.group(2))))

    def progress(self):
        """Return ``(iteration, unix time)`` rank 0 last reported, or None."""
        try:
            with open(self.progress_path) as f:
                it, t = f.read().split()
            return int(it), float(t)
        except (OSError, ValueError):
            return None

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        self.out.join(10)


def newest_complete(ckpt):
    """Return the newest iteration of which every rank's snapshot file is in ``ckpt`` (None: none)."""
    have = {}
    try:
        names = os.listdir(ckpt)
    except OSError:
        return None
    for n in names:
        m = re.match(r'^chaos\.(\d+)\.(\d+)$', n)
        if m:
            have.setdefault(int(m.group(2)), set()).add(int(m.group(1)))
    full = [it for it, ranks in have.items() if ranks >= set(range(SIZE))]
    return max(full) if full else None


class Bench:
    def __init__(self, args):
        self.args = args
        self.iterations = args.iterations or int(round(args.minutes * 60.0 / args.pace))
        self.work = self.ckpt = self.cluster = self.hosts = self.mpiexec = None
        self.mounted = False
        self.runs = []

    # -- making and removing what the run needs -------------------------------------------------
    def setup(self):
        from chainermn.cluster import Cluster
        from chainermn_comm.mpirun import find_mpiexec
        self.work = tempfile.mkdtemp(prefix='chainermn-chaos-', dir=self.args.work_parent)
        os.chmod(self.work, 0o700)
        self.ckpt = os.path.join(self.work, 'ckpt')
        os.mkdir(self.ckpt, 0o700)
        # Before the nodes exist: each node's mount namespace is a copy of this one.
        subprocess.run(['mount', '-t', 'tmpfs', '-o', 'mode=0700,size={}m'.format(self.args.disk_mb),
                        'tmpfs', self.ckpt], check=True)
        self.mounted = True
        self.cluster = Cluster(nodes=NODES).start()
        self.hosts = os.path.join(self.work, 'hosts')
        with open(self.hosts, 'w') as f:
            f.write(''.join(h + '\n' for h in self.cluster.hostnames))
        # Hydra must tell the nodes' proxies the head's address on the cluster's bridge.
        self.mpiexec = os.path.join(self.work, 'mpiexec')
        with open(self.mpiexec, 'w') as f:
            f.write('#!/bin/sh\nexec {} -localhost {} "$@"\n'.format(find_mpiexec(), self.cluster.head_address))
        os.chmod(self.mpiexec, 0o700)

    def teardown(self):
        for run in self.runs:
            try:
                run.stop()
            except Exception as e:   # go on removing the rest
                _say('could not stop the launcher: {}'.format(e))
        if self.cluster is not None:
            for node in range(NODES):
                try:
                    self.cluster.link_up(node)
                except Exception:
                    pass
            self.cluster.close()
        if self.mounted:
            subprocess.run(['umount', '-l', self.ckpt])
        if self.work is not None:
            if self.args.keep:
                _say('kept the work directory {}'.format(self.work))
            else:
                shutil.rmtree(self.work, ignore_errors=True)

    # -- the ranks' processes -------------------------------------------------------------------
    def rank_pid(self, rank):
        """Return the pid (seen from here) of rank ``rank`` of the job now running, or None."""
        want = 'PMI_RANK={}'.format(rank).encode()
        for node in self.cluster.nodes:
            for pid, _, _ in self.cluster.processes(node):
                try:
                    with open('/proc/{}/cmdline'.format(pid), 'rb') as f:
                        if JOB.encode() not in f.read():
                            continue
                    with open('/proc/{}/environ'.format(pid), 'rb') as f:
                        if want in f.read().split(b'\0'):
                            return pid
                except OSError:
                    continue
        return None

    # -- the two runs ---------------------------------------------------------------------------
    def finals(self, tag):
        out = {}
        for r in range(SIZE):
            with numpy.load(os.path.join(self.work, 'final.{}.{}.npz'.format(tag, r))) as f:
                out[r] = {k: f[k].copy() for k in f.files}
        return out

    def reference(self):
        ref_ckpt = os.path.join(self.work, 'ref_ckpt')
        os.mkdir(ref_ckpt, 0o700)
        _say('reference: {} iterations without faults or pacing'.format(self.iterations))
        run = Run(self, 'ref', 0.0, ref_ckpt, 0)
        self.runs.append(run)
        try:
            run.proc.wait(timeout=self.args.timeout)
        except subprocess.TimeoutExpired:
            raise SystemExit('chaos run: the reference run did not finish within {:.0f} s'.format(
                self.args.timeout))
        run.out.join(10)
        seconds = time.monotonic() - run.started
        if run.proc.returncode != 0:
            raise SystemExit('chaos run: the reference run failed with status {}; the end of its output:\n{}'
                             .format(run.proc.returncode, _tail(run)))
        _say('reference done in {:.1f} s'.format(seconds))
        return seconds

    def chaos(self):
        args = self.args
        run = Run(self, 'chaos', args.pace, self.ckpt, max(3, 3 * args.faults))
        self.runs.append(run)
        faults = []
        deadline = run.started + args.timeout
        first = self._wait_progress(run, lambda p: p[0] >= 1, deadline)
        if first is None:
            return run, faults, None
        t0 = time.monotonic()
        # The time of an iteration without faults, measured before the first fault.
        settle = min(20.0, 0.1 * self.iterations * args.pace)
        p0 = run.progress()
        self._sleep_until(t0 + settle, run)
        p1 = run.progress()
        pace = (p1[1] - p0[1]) / max(1, p1[0] - p0[0]) if p1 and p0 and p1[0] > p0[0] else args.pace
        _say('training: {:.3f} s per iteration without faults ({} iterations to go)'.format(
            pace, self.iterations - (p1[0] if p1 else 0)))
        span = self.iterations * pace
        plan = schedule([k for k in args.kinds.split(',')], args.faults, settle, 0.8 * span, args.seed)
        ready_at = 0
        for at, kind, rng in plan:
            self._sleep_until(t0 + at, run)
            ok = self._wait_ready(run, ready_at, deadline)
            if not ok:
                _say('fault {} ({}) not injected: {}'.format(len(faults) + 1, kind, ok.why))
                faults.append({'kind': kind, 'injected': False, 'why': ok.why})
                continue
            f = self._inject(run, kind, rng, t0, pace)
            faults.append(f)
            ready_at = f.get('recovered_iteration') or 0
            _say('fault {} {} {}: {}'.format(len(faults), kind, f.get('target', ''), f['outcome']))
        try:
            run.proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _say('the job did not finish within --timeout {:.0f} s'.format(args.timeout))
        run.out.join(10)
        return run, faults, pace

    # -- waiting ----------------------------------------------------------------------------------
    @staticmethod
    def _sleep_until(when, run):
        while time.monotonic() < when and run.alive():
            time.sleep(0.1)

    @staticmethod
    def _wait_progress(run, cond, deadline):
        while time.monotonic() < deadline:
            p = run.progress()
            if p is not None and cond(p):
                return p
            if not run.alive():
                return None
            time.sleep(0.05)
        return None

    def _wait_ready(self, run, after, deadline):
        """Wait until the job trains past ``after`` + a generation; return a truthy or a reason."""
        need = after + self.args.cp_every + 2
        end = self.iterations - 3 * self.args.cp_every
        while time.monotonic() < deadline:
            if not run.alive():
                return _No('the job is over')
            p = run.progress()
            if p is not None and p[0] >= end:
                return _No('the job is within {} iterations of its end'.format(3 * self.args.cp_every))
            if p is not None and p[0] >= need and time.time() - p[1] < 2.0:
                return True
            time.sleep(0.05)
        return _No('out of time')

    # -- faults -------------------------------------------------------------------------------------
    def _inject(self, run, kind, rng, t0, pace):
        args = self.args
        line0 = len(run.out.lines)
        failures0 = len(run.failures)
        f = {'kind': kind, 'injected': True}
        p = run.progress()
        t_fault, i_fault = time.monotonic(), p[0]
        if kind == 'kill':
            rank = rng.randrange(SIZE)
            f['target'] = 'rank {}'.format(rank)
            pid = self.rank_pid(rank)
            if pid is None:
                f.update(injected=False, why='rank {} not found'.format(rank), outcome='not injected')
                return f
            os.kill(pid, signal.SIGKILL)
            t_fault, i_fault = time.monotonic(), run.progress()[0]
        elif kind == 'kill-write':
            rank, point = rng.randrange(SIZE), rng.choice(WRITE_POINTS)
            f['target'] = 'rank {} at {}'.format(rank, point)
            path = os.path.join(self.work, 'kill_at')
            with open(path + '.tmp', 'w') as fh:
                fh.write('{}@{}'.format(point, rank))
            os.replace(path + '.tmp', path)
            # It dies at its next save (or agreement): the fault is when progress stops.
            hit = run.out.wait_for(_FAILED, line0, 3 * args.cp_every * pace + 120)
            if hit is None:
                f.update(outcome='the rank did not die at {}'.format(point), survived=False)
                return f
            t_fault, i_fault = self._last_progress_before(run, hit[1])
        elif kind == 'stop':
            rank = rng.randrange(SIZE)
            f['target'] = 'rank {} for {:g} s'.format(rank, args.stop_seconds)
            pid = self.rank_pid(rank)
            if pid is None:
                f.update(injected=False, why='rank {} not found'.format(rank), outcome='not injected')
                return f
            os.kill(pid, signal.SIGSTOP)
            t_fault, i_fault = time.monotonic(), run.progress()[0]
            time.sleep(args.stop_seconds)
            os.kill(pid, signal.SIGCONT)
        elif kind == 'link':
            node = rng.randrange(NODES)
            f['target'] = 'node{} for {:g} s'.format(node, args.link_seconds)
            t_fault, i_fault = time.monotonic(), run.progress()[0]
            self.cluster.link_down(node)
            try:
                time.sleep(args.link_seconds)
            finally:
                self.cluster.link_up(node)
        elif kind == 'disk':
            every = args.cp_every
            f['target'] = 'checkpoint tmpfs ({} MB)'.format(args.disk_mb)
            # Full from mid-interval (the last save's write is long done) until just after the
            # next save started its write (a few ms): that save, and only that one, fails.
            mid = self._wait_progress(run, lambda q: every // 4 <= q[0] % every <= every // 2,
                                      time.monotonic() + every * pace * 3 + 60)
            if mid is None:
                f.update(injected=False, why='the job stopped', outcome='not injected')
                return f
            target = (mid[0] // every + 1) * every
            filler = os.path.join(self.ckpt, '.filler')
            t_fault, i_fault = time.monotonic(), mid[0]
            _fill(filler)
            try:
                self._wait_progress(run, lambda q: q[0] >= target + 3 or q[0] < mid[0],
                                    time.monotonic() + every * pace * 3 + 60)
            finally:
                os.remove(filler)
            # Reported at the agreement before the save after it.
            hit = run.out.wait_for(_SAVE_FAILED, line0, 2 * every * pace + 60)
            f['failed_save'] = int(hit[2].group(1)) if hit else None
            if hit is None:
                f.update(outcome='no save failed while the disk was full', survived=False)
            elif f['failed_save'] != target:
                f.update(outcome='the save of iteration {} failed, not {}'.format(f['failed_save'], target),
                         survived=False)
        else:
            raise ValueError('unknown fault kind {!r}'.format(kind))
        f['at'] = t_fault - t0
        f['iteration'] = i_fault
        rec = self._recover(run, f, kind, failures0, i_fault, t_fault)
        t_rec = None if rec is None else time.monotonic() - (time.time() - rec[1])
        failures = run.failures[failures0:]
        resumes = [r for r in run.resumes if r[0] > t_fault and failures and r[0] > failures[0][0]]
        f['failure_index'] = list(range(failures0, len(run.failures)))
        f['restarts'] = len(failures)
        f['failed'] = [r for _, r, _, _ in failures]
        f['generations'] = [g for _, g in resumes]
        f['should_load'] = [g for _, _, g, _ in failures]
        f['reached'] = [it for _, _, _, it in failures]
        f['redone'] = sum((it or 0) - (g or 0) for (_, _, _, it), (_, g) in zip(failures, resumes))
        f['lost_generations'] = sum(1 for g, s in zip(f['generations'], f['should_load']) if g != s) + \
            max(0, len(failures) - len(resumes))
        if rec is None:
            f.update(survived=False, outcome=f.get('outcome') or 'the job did not train again within {:.0f} s'
                     .format(args.recover_timeout))
            return f
        f['recovered_iteration'] = rec[0]
        f['lost_seconds'] = max(0.0, (t_rec - t_fault) - (rec[0] - i_fault) * pace)
        if 'survived' not in f:
            f['survived'] = f['lost_generations'] == 0 and (kind != 'disk' or 'next_complete' in f)
        restarts = failures
        if kind in ('stop', 'disk') and restarts:
            f['survived'] = False   # neither a slow rank nor a full disk may end an attempt
        f['outcome'] = ('restarted {}x from generation {}'.format(len(restarts), f['generations'])
                        if restarts else 'survived without a restart') + \
            (', save of iteration {} failed, {} complete'.format(f['failed_save'], f.get('next_complete'))
             if kind == 'disk' else '') + ('' if f['survived'] else ' [NOT SURVIVED]')
        return f

    def _recover(self, run, f, kind, failures0, i_fault, t_fault):
        """Wait until the job is back past ``i_fault`` (after any restart the fault caused); return progress.

        A failure may still come after the job seemed to go on (the launcher's heartbeat finds a
        host that stopped answering only after its probe times out): the job is watched that long.
        """
        args = self.args
        deadline = time.monotonic() + args.recover_timeout
        grace = args.heartbeat + args.probe_timeout + 5.0
        while True:
            seen = len(run.failures)
            last_fail = run.failures[-1][0] if seen > failures0 else None
            rec = self._wait_progress(
                run, lambda q: q[0] > i_fault and time.time() - q[1] < 1.0 and (
                    last_fail is None or time.monotonic() - (time.time() - q[1]) > last_fail), deadline)
            if rec is None:
                return None
            t_rec = time.monotonic()
            if kind == 'disk' and f.get('failed_save') is not None and 'next_complete' not in f:
                # ... and a save after the failed one is complete on every rank.
                while time.monotonic() < deadline and run.alive():
                    newest = newest_complete(self.ckpt)
                    if newest is not None and newest > f['failed_save']:
                        f['next_complete'] = newest
                        break
                    time.sleep(0.1)
            while time.monotonic() < t_rec + grace and len(run.failures) == seen and run.alive():
                time.sleep(0.1)
            if len(run.failures) == seen:
                return rec
            _say('the job failed after it seemed to go on; waiting for it again')

    @staticmethod
    def _last_progress_before(run, when):
        """Return ``(monotonic time, iteration)`` of the job's last progress report (it has stopped)."""
        p = run.progress()
        if p is None:
            return when, 0
        return time.monotonic() - (time.time() - p[1]), p[0]


def _tail(run, lines=40):
    return '\n'.join(line for _, line in run.out.since(0)[-lines:])


class _No:
    def __init__(self, why):
        self.why = why

    def __bool__(self):
        return False


def _fill(path):
    """Fill the file system of ``path`` with one file (until ENOSPC)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    block = b'\0' * (1 << 20)
    try:
        while True:
            try:
                os.write(fd, block)
            except OSError:
                break
        for size in (1 << 16, 4096, 512):   # the last bytes too
            while True:
                try:
                    os.write(fd, block[:size])
                except OSError:
                    break
    finally:
        os.close(fd)


def _table(faults, totals):
    head = ('#', 'fault', 'target', 'time s', 'restarts', 'resumed from', 'redone', 'lost s', 'outcome')
    rows = []
    for i, f in enumerate(faults, 1):
        if not f.get('injected'):
            rows.append((str(i), f['kind'], '-', '-', '-', '-', '-', '-', 'not injected: ' + f.get('why', '')))
            continue
        gens = ','.join('none' if g is None else str(g) for g in f.get('generations', [])) or '-'
        rows.append((str(i), f['kind'], f.get('target', ''), '{:.0f}'.format(f.get('at', 0)),
                     str(f.get('restarts', 0)), gens, str(f.get('redone', 0)),
                     '{:.1f}'.format(f['lost_seconds']) if 'lost_seconds' in f else '-', f['outcome']))
    widths = [max(len(r[c]) for r in rows + [head]) for c in range(len(head) - 1)]
    fmt = '  '.join('{:<%d}' % w for w in widths) + '  {}'
    lines = [fmt.format(*head), fmt.format(*['-' * w for w in widths] + ['-------'])]
    lines += [fmt.format(*r) for r in rows]
    lines.append('')
    lines += ['{}: {}'.format(k, v) for k, v in totals.items()]
    return '\n'.join(lines)


def _parser():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--minutes', type=float, default=10.0, help='length of the paced job without faults')
    p.add_argument('--faults', type=int, default=10)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--kinds', default=','.join(KINDS), help='fault kinds, taken in turn')
    p.add_argument('--pace', type=float, default=0.25, help='seconds each iteration sleeps (chaos run)')
    p.add_argument('--iterations', type=int, default=None, help='default: minutes * 60 / pace')
    p.add_argument('--cp-every', type=int, default=20, help='iterations between two saves')
    p.add_argument('--stop-seconds', type=float, default=30.0)
    p.add_argument('--link-seconds', type=float, default=10.0)
    p.add_argument('--disk-mb', type=int, default=64, help='size of the checkpoint tmpfs')
    p.add_argument('--watchdog', type=float, default=120.0, help='CHAINERMN_TIMEOUT of the job')
    p.add_argument('--heartbeat', type=float, default=5.0, help="the launcher's --heartbeat")
    p.add_argument('--probe-timeout', type=float, default=10.0, help="the launcher's --probe-timeout")
    p.add_argument('--recover-timeout', type=float, default=300.0,
                   help='longest wait for the job to train again after a fault')
    p.add_argument('--timeout', type=float, default=3600.0, help='longest run of each job')
    p.add_argument('--work-parent', default=None, help='where the work directory is made')
    p.add_argument('--json', default=None, help='write the results here')
    p.add_argument('--keep', action='store_true', help='keep the work directory (logs)')
    return p


def main(argv=None):
    args = _parser().parse_args(argv)
    bad = [k for k in args.kinds.split(',') if k not in KINDS]
    if bad or args.faults < 1:
        raise SystemExit('chaos run: unknown fault kinds {} (known: {})'.format(bad, ', '.join(KINDS)))
    from chainermn.cluster import missing
    problems = missing()
    if problems:
        sys.stderr.write('chaos run: cannot build a cluster of namespaces here; missing: {}\n'.format(
            '; '.join(problems)))
        return 2
    bench = Bench(args)

    def stop(signum, frame):
        raise SystemExit('chaos run: got signal {}; cleaning up'.format(signum))

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)
    started = time.monotonic()
    try:
        bench.setup()
        ref_seconds = bench.reference()
        run, faults, pace = bench.chaos()
        status = run.proc.returncode
        chaos_seconds = time.monotonic() - run.started
        bits, compared = 0, 0
        finished = status == 0
        if finished:
            ref, got = bench.finals('ref'), bench.finals('chaos')
            for r in range(SIZE):
                if sorted(ref[r]) != sorted(got[r]):
                    bits += 1 << 30
                    continue
                for k in ref[r]:
                    bits += differing_bits(ref[r][k], got[r][k])
                    compared += ref[r][k].nbytes
        log = run.out.since(0)
        left = [p for node in bench.cluster.nodes for p in bench.cluster.processes(node)]
        # The launcher's own account of each restart (printed when the attempt after it ends).
        by_failure = {i: f for f in faults for i in f.get('failure_index', [])}
        for _, line in log:
            m = _RESTART.search(line)
            f = m and by_failure.get(int(m.group(1)) - 1)
            if f:
                f.setdefault('launcher', []).append(line.split('chainermn launch: ', 1)[1])
                gen = None if m.group(2) == 'none' else int(m.group(2))
                if gen not in f['generations']:
                    f['survived'] = False
                    f['outcome'] += ' [the launcher says generation {}]'.format(gen)
        failed_saves = [int(m.group(1)) for _, line in log for m in [_SAVE_FAILED.search(line)] if m]
        injected = [f for f in faults if f.get('injected')]
        totals = {
            'faults injected': '{} of {} ({})'.format(len(injected), args.faults, ', '.join(
                '{} {}'.format(sum(1 for f in injected if f['kind'] == k), k) for k in KINDS)),
            'restarts': sum(f.get('restarts', 0) for f in injected),
            'iterations redone': sum(f.get('redone', 0) for f in injected),
            'seconds lost': round(sum(f.get('lost_seconds', 0.0) for f in injected), 1),
            'failed saves reported': len(failed_saves),
            'generations lost or refused': sum(f.get('lost_generations', 0) for f in injected),
            'launcher exit status': status,
            'processes left on the nodes': len(left),
            'iterations': bench.iterations,
            'chaos job seconds': round(chaos_seconds, 1),
            'reference seconds': round(ref_seconds, 1),
            'seconds per iteration (paced, no fault)': round(pace or 0.0, 4),
            'bytes compared (4 ranks: parameters + Adam state)': compared,
            'differing bits': bits if finished else 'n/a (the job did not finish)',
        }
        ok = (finished and bits == 0 and compared > 0 and len(injected) == args.faults and not left
              and all(f.get('survived') for f in injected) and totals['generations lost or refused'] == 0)
        totals['verdict'] = 'PASS' if ok else 'FAIL'
        print(_table(faults, totals))
        if not finished:
            print('the end of the job\'s output:\n' + _tail(run))
        print('command: {} {}'.format(os.path.relpath(__file__, ROOT), ' '.join(argv if argv is not None
                                                                                 else sys.argv[1:])))
        print('whole run: {:.0f} s; load average {}'.format(time.monotonic() - started,
                                                            ' '.join('{:.2f}'.format(x) for x in os.getloadavg())))
        if args.json:
            with open(args.json, 'w') as fh:
                json.dump({'faults': faults, 'totals': totals, 'ok': ok}, fh, indent=1, default=str)
        return 0 if ok else 1
    finally:
        bench.teardown()


if __name__ == '__main__':
    sys.exit(main())
