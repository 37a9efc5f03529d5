"""Can this process build a cluster here?  Say exactly what is missing when it cannot."""

import os
import shutil
import subprocess

__all__ = ['ClusterUnavailable', 'missing', 'require', 'require_hydra']

_CAP_SYS_ADMIN = 21
_CAP_NET_ADMIN = 12


class ClusterUnavailable(RuntimeError):
    """Namespaces, veths or tools needed for a cluster are missing (the command exits 2)."""


def _effective_caps():
    try:
        with open('/proc/self/status') as f:
            for line in f:
                if line.startswith('CapEff:'):
                    return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def _try(cmd):
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         stdin=subprocess.DEVNULL)
    return res.returncode == 0, res.stdout.strip()


def missing(need_tc=False):
    """Return a list of what is missing to build a cluster (empty when everything is there)."""
    problems = []
    if os.name != 'posix' or not os.path.isdir('/proc/self/ns'):
        return ['Linux namespaces (/proc/self/ns): this is not a Linux machine']
    caps = _effective_caps()
    for bit, name in ((_CAP_SYS_ADMIN, 'CAP_SYS_ADMIN'), (_CAP_NET_ADMIN, 'CAP_NET_ADMIN')):
        if not caps >> bit & 1:
            problems.append('{} (run as root: namespaces, mounts and veths need it)'.format(name))
    tools = ['ip', 'unshare', 'nsenter', 'mount', 'hostname'] + (['tc'] if need_tc else [])
    for tool in tools:
        if shutil.which(tool) is None:
            problems.append('the `{}` command (install {})'.format(
                tool, 'iproute2' if tool in ('ip', 'tc') else 'util-linux' if tool != 'hostname'
                else 'hostname'))
    if problems:
        return problems
    name = 'cmnchk{}'.format(os.getpid() % 10 ** 8)
    ok, out = _try(['ip', 'link', 'add', name, 'type', 'veth', 'peer', 'name', name[:13] + 'p'])
    if ok:
        _try(['ip', 'link', 'del', name])
    else:
        problems.append('veth interfaces (`ip link add ... type veth` failed: {})'.format(out))
    ok, out = _try(['unshare', '--uts', '--mount', '--ipc', '--pid', '--net', '--fork', '--mount-proc', 'true'])
    if not ok:
        problems.append('UTS/mount/IPC/PID/network namespaces (`unshare` failed: {})'.format(out))
    return problems


def require(need_tc=False):
    """Raise ClusterUnavailable naming everything that is missing."""
    problems = missing(need_tc)
    if problems:
        raise ClusterUnavailable('cannot build a cluster of namespaces here; missing: ' + '; '.join(problems))


def require_hydra(mpiexec):
    """Raise ClusterUnavailable unless ``mpiexec`` is MPICH's Hydra (its ssh launcher is what nodes need)."""
    try:
        res = subprocess.run([mpiexec, '--version'], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, stdin=subprocess.DEVNULL, timeout=60)
        out = res.stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        out = str(e)
    if 'HYDRA' not in out:
        raise ClusterUnavailable(
            'the cluster launches ranks with Hydra (MPICH, MVAPICH, Intel MPI) through '
            '`-launcher ssh -launcher-exec`, but {} is not Hydra ({}); use the mpiexec of an MPICH-family '
            'MPI, e.g. `pip install mpich mpi4py` in this venv'.format(mpiexec, out.strip()[:200] or 'no output'))
