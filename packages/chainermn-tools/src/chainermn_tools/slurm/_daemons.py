"""Start and stop munged, slurmctld and one slurmd per node, given a way to run a command on each."""

import os
import time

from chainermn_comm import safe_files

__all__ = ['SlurmDaemons', 'SlurmError', 'find_slurm', 'MISSING_HINT']

#: The programs a cluster needs and where Debian installs the daemons.
_PROGRAMS = ('munged', 'slurmctld', 'slurmd', 'srun', 'sinfo', 'scontrol')
MISSING_HINT = ('install Slurm and MUNGE: `bash scripts/install_slurm.sh` (apt: slurmctld slurmd '
                'slurm-client munge)')


class SlurmError(RuntimeError):
    """A Slurm daemon did not start or the cluster did not come up."""


def find_slurm():
    """Return {program: path} for munged, slurmctld, slurmd, srun, sinfo, scontrol; raise if one is missing."""
    found, missing = {}, []
    for name in _PROGRAMS:
        for d in os.environ.get('PATH', '').split(os.pathsep) + ['/usr/sbin', '/usr/bin', '/sbin']:
            path = os.path.join(d, name)
            if d and os.access(path, os.X_OK):
                found[name] = path
                break
        else:
            missing.append(name)
    if missing:
        raise SlurmError('Slurm is not installed here (missing {}): {}'.format(
            ', '.join(missing), MISSING_HINT))
    return found


class SlurmDaemons:
    """The daemons of one cluster: munged and slurmctld on the head, slurmd on every node.

    ``run_head(argv)`` and ``run_node(name, argv)`` run a command inside the head or a node
    (its namespaces, or over ssh) and return a ``subprocess.CompletedProcess``; the daemons
    background themselves, so a blocking call is enough. ``files`` is what write_config() returned.
    """

    def __init__(self, files, nodes, run_head, run_node):
        self.files = files
        self.nodes = list(nodes)
        self.run_head = run_head
        self.run_node = run_node
        self.programs = find_slurm()
        #: Seconds each phase took: 'munged', 'slurmctld', 'slurmd', 'idle' (all nodes idle).
        self.timings = {}

    def env(self):
        """Return the environment variables a client command (srun, sinfo, ...) needs."""
        return {'SLURM_CONF': self.files.slurm_conf}

    def _check(self, proc, what):
        if proc.returncode != 0:
            raise SlurmError('{} failed (exit {}): {}\nlogs: {}'.format(
                what, proc.returncode, (proc.stderr or b'').decode(errors='replace').strip(),
                self.files.log_dir))

    def _timed(self, name, fn):
        start = time.monotonic()
        fn()
        self.timings[name] = time.monotonic() - start

    def start(self, timeout=60.0):
        """Start every daemon and wait until every node is idle; return self.timings."""
        f, p = self.files, self.programs
        self._timed('munged', lambda: self._check(self.run_head([
            p['munged'], '--force', '--socket=' + f.munge_socket, '--key-file=' + f.munge_key,
            '--pid-file=' + os.path.join(f.run_dir, 'munged.pid'),
            '--log-file=' + os.path.join(f.log_dir, 'munged.log'),
            '--seed-file=' + os.path.join(os.path.dirname(f.munge_key), 'munge.seed')]), 'munged'))
        self._timed('slurmctld', lambda: self._check(
            self.run_head([p['slurmctld'], '-f', f.slurm_conf]), 'slurmctld'))

        def slurmds():
            for node in self.nodes:
                self._check(self.run_node(node.name, [p['slurmd'], '-f', f.slurm_conf, '-N', node.name]),
                            'slurmd on {}'.format(node.name))
        self._timed('slurmd', slurmds)
        self._timed('idle', lambda: self.wait_idle(timeout))
        self.timings['total'] = sum(self.timings[k] for k in ('munged', 'slurmctld', 'slurmd', 'idle'))
        return dict(self.timings)

    def node_states(self):
        """Return {node name: state} as sinfo reports it (empty when slurmctld does not answer)."""
        proc = self.run_head([self.programs['sinfo'], '-h', '-N', '-o', '%N %T'], env=self.env())
        if proc.returncode != 0:
            return {}
        out = {}
        for line in proc.stdout.decode(errors='replace').splitlines():
            parts = line.split()
            if len(parts) == 2:
                out[parts[0]] = parts[1]
        return out

    def wait_idle(self, timeout=60.0):
        """Poll sinfo until every node is idle; raise SlurmError naming the laggards on timeout."""
        deadline = time.monotonic() + timeout
        states = {}
        while time.monotonic() < deadline:
            states = self.node_states()
            if states and all(states.get(n.name) == 'idle' for n in self.nodes):
                return states
            time.sleep(0.1)
        raise SlurmError('nodes not idle after {:.0f} s: {} (logs: {})'.format(
            timeout, states or 'slurmctld does not answer', self.files.log_dir))

    def _kill_pidfile(self, run, path, *args):
        # The pid file must be this user's own (the daemons write it as root); the kill runs inside
        # the head's or node's PID namespace, so it reaches only a process there.
        try:
            with safe_files.open_trusted(path, 'Slurm pid file', allow_shared=False) as fh:
                pid = int(fh.read(32).strip())
        except (OSError, ValueError):
            return
        if pid > 1:
            run(*(args + (['kill', '-TERM', str(pid)],)))

    def stop(self):
        """Stop the slurmds, slurmctld and munged (by their pid files, inside their namespaces)."""
        f = self.files
        for node in self.nodes:
            self._kill_pidfile(self.run_node, os.path.join(f.run_dir, 'slurmd-{}.pid'.format(node.name)),
                               node.name)
        self._kill_pidfile(self.run_head, os.path.join(f.run_dir, 'slurmctld.pid'))
        self._kill_pidfile(self.run_head, os.path.join(f.run_dir, 'munged.pid'))
