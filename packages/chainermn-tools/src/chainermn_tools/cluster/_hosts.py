"""Files that tie the nodes together: /etc/netns hosts files, the mpiexec host file, the launcher."""

import os
import shutil
import stat

__all__ = ['hosts_text', 'write_netns_hosts', 'remove_netns_files', 'core_slices', 'write_hostfile',
           'write_launcher']

NETNS_ETC = '/etc/netns'

# Hydra's ssh launcher runs `PROGRAM -x HOST COMMAND...`, COMMAND quoted for a remote shell.  This
# program enters HOST's namespaces instead (no ssh daemon).
_LAUNCHER = '''#!/bin/sh
# chainermn cluster {prefix}: Hydra's ssh launcher replacement (-launcher-exec); enters a node.
while [ $# -gt 0 ]; do
  case "$1" in -x|-q|-T) shift ;; *) break ;; esac
done
host="$1"; shift
case "$host" in
{cases}
  *) echo "chainermn cluster {prefix}: no node named '$host' (nodes: {names})" >&2; exit 255 ;;
esac
exec nsenter --target "$pid" --mount --uts --ipc --net --pid --root -- /bin/sh -c "exec $*"
'''


def hosts_text(head_name, head_address, names, addresses):
    """Return an /etc/hosts that resolves the head and every node."""
    lines = ['127.0.0.1 localhost', '::1 localhost ip6-localhost ip6-loopback',
             '{} {}'.format(head_address, head_name)]
    lines += ['{} {}'.format(a, n) for n, a in zip(names, addresses)]
    return '\n'.join(lines) + '\n'


def write_netns_hosts(netns, text):
    """Write ``/etc/netns/NETNS/hosts`` (``ip netns exec`` bind-mounts it over /etc/hosts)."""
    d = os.path.join(NETNS_ETC, netns)
    for attempt in range(3):    # another cluster's teardown may remove an empty /etc/netns meanwhile
        try:
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, 'hosts'), 'w') as f:
                f.write(text)
            return
        except FileNotFoundError:
            if attempt == 2:
                raise


def remove_netns_files(netns):
    """Remove ``/etc/netns/NETNS`` (and /etc/netns itself once empty)."""
    shutil.rmtree(os.path.join(NETNS_ETC, netns), ignore_errors=True)
    try:
        os.rmdir(NETNS_ETC)
    except OSError:
        pass


def core_slices(cpus, nodes, ranks_per_node):
    """Return each node's CPUs (one per rank, disjoint) from ``cpus``, or None when too few.

    The nodes share this machine's CPUs: a node's Hydra proxy would bind its ranks from CPU 0 up,
    the same CPUs on every node, so each node is given its own slice instead.
    """
    cpus = sorted(cpus)
    if nodes * ranks_per_node > len(cpus):
        return None
    return [cpus[i * ranks_per_node:(i + 1) * ranks_per_node] for i in range(nodes)]


def write_hostfile(path, names, ranks_per_node, slices=None):
    """Write an mpiexec host file: ``ranks_per_node`` slots on each node, bound to ``slices[i]`` if given."""
    with open(path, 'w') as f:
        for i, n in enumerate(names):
            bind = '' if slices is None else ' binding=user:' + ','.join(map(str, slices[i]))
            f.write('{}:{}{}\n'.format(n, ranks_per_node, bind))
    return path


def write_launcher(path, prefix, names, holder_pids):
    """Write the launcher program that enters node ``names[i]`` through ``holder_pids[i]``."""
    cases = '\n'.join('  {}) pid={} ;;'.format(n, p) for n, p in zip(names, holder_pids))
    with open(path, 'w') as f:
        f.write(_LAUNCHER.format(prefix=prefix, cases=cases, names=' '.join(names)))
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path
