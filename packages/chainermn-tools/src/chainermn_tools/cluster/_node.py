"""One node: its long-lived namespace holder (PID 1), entering it, listing and signalling its processes."""

import ctypes
import os
import select
import signal
import subprocess
import sys
import time

from chainermn_comm import safe_files

from chainermn_tools.cluster._registry import process_start

__all__ = ['NodeError', 'start_holder', 'enter_command', 'node_processes', 'signal_processes', 'wait_gone']

_INIT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '_init.py')

# Runs as PID 1 of the node before the holder replaces it: name the host, give the node its own
# /dev/shm, put its scratch at the common path and hide the other nodes' scratch directories.
_SETUP = '\n'.join([
    'set -e',
    'hostname "$1"',
    'mount -t tmpfs -o mode=1777 tmpfs /dev/shm',
    'mount --bind "$2" "$3"',
    'mount -t tmpfs -o mode=0755,size=64k tmpfs "$4"',
    'exec "$5" -I -S "$6" "$7"',
])


class NodeError(RuntimeError):
    """A node could not be started."""


def _die_with_parent():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)       # PR_SET_PDEATHSIG: the node dies with the process that made it


def start_holder(netns, hostname, scratch, node_local, nodes_dir, log_path, timeout=60.0, env=None):
    """Start the node's namespace holder; return ``(launcher Popen, holder pid, holder start time)``.

    ``env``: variables added to the holder's environment (the cluster's secret token); its output
    goes to the new file ``log_path``.
    """
    r, w = os.pipe()
    cmd = ['ip', 'netns', 'exec', netns, 'unshare', '--uts', '--mount', '--ipc', '--pid', '--fork',
           '--mount-proc', '--kill-child=SIGKILL', 'sh', '-c', _SETUP, 'sh', hostname, scratch,
           node_local, nodes_dir, sys.executable, _INIT, str(w)]
    try:
        log = safe_files.open_new(log_path, mode=0o600)
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(w,),
                                    preexec_fn=_die_with_parent, start_new_session=True,
                                    env=dict(os.environ, **(env or {})))
        finally:
            os.close(log)
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)
    try:
        ready, _, _ = select.select([r], [], [], timeout)
        line = os.read(r, 64) if ready else b''
    finally:
        os.close(r)
    if line != b'ready\n':
        proc.kill()
        proc.wait()
        with safe_files.open_trusted(log_path, 'node log', allow_shared=False) as f:
            detail = f.read().decode(errors='replace').strip()[-2000:]
        raise NodeError('node {} did not start{}: {}'.format(
            hostname, '' if ready else ' within {:.0f} s'.format(timeout), detail or 'no output'))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = _child_of(proc.pid)
        if pid is not None:
            return proc, pid, process_start(pid)
        time.sleep(0.01)
    proc.kill()
    raise NodeError('node {}: cannot find its holder process (child of pid {})'.format(hostname, proc.pid))


def _pids():
    return [int(p) for p in os.listdir('/proc') if p.isdigit()]


def _status(pid, key):
    try:
        with open('/proc/{}/status'.format(pid)) as f:
            for line in f:
                if line.startswith(key + ':'):
                    return line.split(None, 1)[1].strip()
    except OSError:
        return None
    return None


def _child_of(ppid):
    for pid in _pids():
        if _status(pid, 'PPid') == str(ppid):
            return pid
    return None


def enter_command(holder_pid, argv, cwd=None):
    """Return the argv that runs ``argv`` inside the node whose holder is ``holder_pid``."""
    # --root: the holder's root directory, not the mount namespace's (they differ in a chroot).
    cmd = ['nsenter', '--target', str(holder_pid), '--mount', '--uts', '--ipc', '--net', '--pid', '--root']
    if cwd is not None:
        cmd.append('--wd={}'.format(cwd))
    return cmd + ['--'] + [str(a) for a in argv]


def _comm(pid):
    try:
        with open('/proc/{}/comm'.format(pid)) as f:
            return f.read().strip()
    except OSError:
        return None


def node_processes(holder_pid):
    """Return ``[(pid, ppid, comm)]`` of every process of the node except its holder (root-namespace pids)."""
    try:
        ns = os.readlink('/proc/{}/ns/pid'.format(holder_pid))
    except OSError:
        return []
    found = []
    for pid in _pids():
        if pid == holder_pid:
            continue
        try:
            if os.readlink('/proc/{}/ns/pid'.format(pid)) != ns:
                continue
        except OSError:
            continue
        found.append((pid, int(_status(pid, 'PPid') or 0), _comm(pid)))
    return found


def _running(pid):
    state = _status(pid, 'State')
    return state is not None and not state.startswith(('Z', 'X'))


def wait_gone(pids, timeout=10.0):
    """Wait until none of ``pids`` runs (zombies count as gone); return True if they all ended in time."""
    deadline = time.monotonic() + timeout
    while any(_running(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def _has_env(pid, entry):
    try:
        with open('/proc/{}/environ'.format(pid), 'rb') as f:
            return entry in f.read().split(b'\0')
    except OSError:
        return False


def signal_processes(holder_pid, sig, ranks_only=False, env_entry=None):
    """Send ``sig`` to the node's processes; return the pids signalled.

    ``ranks_only``: only what MPI's ``hydra_pmi_proxy`` started; ``env_entry`` (``b'NAME=VALUE'``):
    only processes whose environment holds it.
    """
    procs = node_processes(holder_pid)
    if env_entry is not None:
        procs = [p for p in procs if _has_env(p[0], env_entry)]
    if ranks_only:
        parent = {pid: ppid for pid, ppid, _ in procs}
        proxies = {pid for pid, _, comm in procs if comm == 'hydra_pmi_proxy'}

        def under_proxy(pid):
            seen = set()
            while pid in parent and pid not in seen:
                seen.add(pid)
                pid = parent[pid]
                if pid in proxies:
                    return True
            return False

        procs = [p for p in procs if p[0] not in proxies and under_proxy(p[0])]
    sent = []
    for pid, _, _ in procs:
        try:
            os.kill(pid, sig)
            sent.append(pid)
        except ProcessLookupError:
            pass
    return sent
