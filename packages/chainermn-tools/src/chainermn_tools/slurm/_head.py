"""Named Linux namespaces with their own init, for Slurm's head (slurmctld, munged, where srun runs).

Each namespace's PID 1 reaps orphans and exits on SIGTERM; killing it removes every process and
mount the namespace held.  The nodes themselves come from ``chainermn_tools.cluster`` (the one
namespace-cluster builder).  Needs root (or CAP_SYS_ADMIN), util-linux's unshare/nsenter.
"""

import os
import shutil
import signal
import subprocess
import sys
import time

from chainermn_tools.cluster import ClusterUnavailable

__all__ = ['NamespaceError', 'Namespaces']

# PID 1 of each namespace: reaps orphans (slurmstepd's children) and exits on SIGTERM, which
# makes the kernel kill everything else in the namespace.
_INIT = ('import os, signal\n'
         'signal.signal(signal.SIGTERM, lambda *a: os._exit(0))\n'
         'signal.signal(signal.SIGCHLD, lambda *a: None)\n'
         'while True:\n'
         '    try:\n'
         '        os.wait()\n'
         '    except ChildProcessError:\n'
         '        signal.pause()\n')


class NamespaceError(ClusterUnavailable):
    """Linux namespaces (or the tools to make them) are not available here."""


def _tools():
    missing = [t for t in ('unshare', 'nsenter') if not shutil.which(t) and not
               os.access('/usr/sbin/' + t, os.X_OK) and not os.access('/sbin/' + t, os.X_OK)]
    if missing:
        raise NamespaceError('cannot make namespaces: {} not installed (util-linux)'.format(
            ', '.join(missing)))


def _children(pid):
    try:
        with open('/proc/{}/task/{}/children'.format(pid, pid)) as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


class Namespaces:
    """Named namespaces of this machine (Slurm's head); run(name, argv) runs a command inside one."""

    def __init__(self):
        self._unshare = {}   # name -> Popen of unshare
        self.init_pid = {}   # name -> host PID of the namespace's init

    def make(self, name, flags):
        """Start namespace ``name`` with unshare ``flags`` (plus a PID namespace's init); wait for it."""
        _tools()
        # If this process dies without stop() (SIGKILL), setpriv's death signal kills unshare and
        # unshare's --kill-child kills the namespace's init: nothing of the cluster outlives us.
        guard = ['setpriv', '--pdeathsig', 'SIGKILL'] if shutil.which('setpriv') else []
        proc = subprocess.Popen(guard + ['unshare'] + flags + ['--fork', '--kill-child=SIGKILL',
                                                              '--mount-proc', '--propagation', 'private',
                                                              sys.executable, '-c', _INIT],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True)
        self._unshare[name] = proc
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            kids = _children(proc.pid)
            if kids:
                self.init_pid[name] = kids[0]
                return
            if proc.poll() is not None:
                raise NamespaceError('cannot make namespaces (unshare {} exited {}): {}'.format(
                    ' '.join(flags), proc.returncode, proc.stderr.read().decode(errors='replace').strip()))
            time.sleep(0.01)
        raise NamespaceError('unshare started no init within 20 s')

    def sh(self, name, ns_flags, script):
        """Run ``sh -ec script`` in the nsenter ``ns_flags`` namespaces of ``name``; raise on failure."""
        proc = subprocess.run(['nsenter', '-t', str(self.init_pid[name])] + ns_flags + ['sh', '-ec', script],
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        if proc.returncode != 0:
            raise NamespaceError('setting up {} failed: {}: {}'.format(
                name, script, proc.stderr.decode(errors='replace').strip()))

    def command(self, name, argv, cwd=None):
        """Return the argv that runs ``argv`` inside namespace ``name`` with working directory ``cwd``."""
        return ['nsenter', '-t', str(self.init_pid[name]), '-a', '--root', '--wd=' + (cwd or os.getcwd())] + list(argv)

    def run(self, name, argv, env=None, cwd=None, timeout=120, **kw):
        """Run ``argv`` inside ``name`` (extra ``env`` on top of ours); return CompletedProcess."""
        full = dict(os.environ, **(env or {}))
        kw.setdefault('stdout', subprocess.PIPE)
        kw.setdefault('stderr', subprocess.PIPE)
        return subprocess.run(self.command(name, argv, cwd), env=full, timeout=timeout,
                              stdin=subprocess.DEVNULL, **kw)

    def stop(self):
        """Kill every namespace's init (the kernel then kills the rest) and reap unshare."""
        for name, pid in list(self.init_pid.items()):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in self._unshare.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stderr:
                proc.stderr.close()
        self.init_pid.clear()
        self._unshare.clear()
