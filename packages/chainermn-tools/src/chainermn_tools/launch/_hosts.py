"""Read the hosts file and probe hosts with a bounded command through the job's own launcher."""

import os
import signal
import subprocess
import threading
import time

__all__ = ['read_hosts', 'probe', 'mpiexec_base', 'kill_group']


def read_hosts(path):
    """Return the host names of ``path`` in order, once each (blank lines and ``#`` comments skipped).

    A line may be ``host`` or ``host:slots`` (slots are ignored: ``--ranks-per-node`` decides).
    """
    hosts = []
    with open(path) as f:
        for line in f:
            line = line.split('#', 1)[0].strip()
            if not line:
                continue
            host = line.split()[0].split(':')[0]
            if host not in hosts:
                hosts.append(host)
    return hosts


def mpiexec_base(mpiexec, launcher_exec=None):
    """Return the start of every Hydra command line (``mpiexec`` and the launcher options)."""
    cmd = [mpiexec]
    if launcher_exec:
        cmd += ['-launcher', 'ssh', '-launcher-exec', launcher_exec]
    return cmd


def _probe_one(base, host, timeout, env, out, cpus):
    start = time.monotonic()
    try:
        # ``nproc``: the CPUs a rank started there may use (whether ranks can have a core each).
        proc = subprocess.Popen(base + ['-hosts', host, '-n', '1', 'nproc'], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    except OSError as e:
        out[host] = (False, 'cannot run {}: {}'.format(base[0], e))
        return
    try:
        text, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        proc.communicate()
        out[host] = (False, 'no answer within {:g} s'.format(timeout))
        return
    if proc.returncode == 0:
        out[host] = (True, 'answered in {:.1f} s'.format(time.monotonic() - start))
        numbers = [ln.strip() for ln in text.decode(errors='replace').splitlines() if ln.strip().isdigit()]
        if numbers and cpus is not None:
            cpus[host] = int(numbers[-1])
    else:
        last = [ln for ln in text.decode(errors='replace').splitlines() if ln.strip()]
        out[host] = (False, 'probe exited with status {}{}'.format(
            proc.returncode, ': ' + last[0][:200] if last else ''))


def kill_group(proc):
    """SIGKILL the process group (session) of ``proc``."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def probe(base, hosts, timeout, env=None, cpus=None):
    """Run ``nproc`` on every host at once through ``base`` (Hydra); return ``{host: (ok, detail)}``.

    ``cpus`` (a dict), when given, receives each answering host's CPU count.
    """
    out = {}
    threads = [threading.Thread(target=_probe_one, args=(base, h, timeout, env, out, cpus), daemon=True)
               for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 5)
    for h in hosts:
        out.setdefault(h, (False, 'probe did not finish'))
    return out
