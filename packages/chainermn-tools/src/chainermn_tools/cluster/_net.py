"""Network of a cluster: a bridge, one veth pair per node, addresses, link rate, counters."""

import ipaddress
import json
import os
import subprocess

__all__ = ['NetError', 'TEST_NET', 'BURST_SECONDS', 'ip', 'subnet', 'used_subnets', 'make_netns', 'make_bridge',
           'add_node_link', 'set_link_rate', 'set_netem', 'set_link', 'link_counters', 'delete_link', 'delete_netns', 'netns_exists',
           'netem_available']

#: The range reserved for network benchmark tests (RFC 2544); the only addresses a cluster uses.
TEST_NET = ipaddress.ip_network('198.18.0.0/15')
#: Name of a node's end of its veth inside the node.
NODE_IFACE = 'eth0'
#: Seconds of traffic at the link rate that a node's token bucket (tbf) lets through at once.
BURST_SECONDS = 0.01


class NetError(RuntimeError):
    """A command that builds or changes the cluster network failed."""


def ip(*args, netns=None, check=True):
    """Run ``ip ARGS`` (inside ``netns`` if given); return its stdout, raise NetError on failure."""
    cmd = ['ip'] + (['-n', netns] if netns else []) + [str(a) for a in args]
    return _run(cmd, check)


def _run(cmd, check=True):
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         stdin=subprocess.DEVNULL)
    if check and res.returncode != 0:
        raise NetError('`{}` failed (status {}): {}'.format(' '.join(cmd), res.returncode,
                                                            res.stderr.strip() or res.stdout.strip()))
    return res.stdout


def subnet(index):
    """Return the ``index``-th /24 of 198.18.0.0/15 (0..511)."""
    nets = list(TEST_NET.subnets(new_prefix=24))
    if not 0 <= index < len(nets):
        raise ValueError('subnet index {} is outside 0..{}'.format(index, len(nets) - 1))
    return nets[index]


def used_subnets():
    """Return the indices of the /24s of 198.18.0.0/15 that some interface of this namespace uses."""
    used = set()
    for line in ip('-o', '-4', 'addr', 'show').splitlines():
        parts = line.split()
        if 'inet' not in parts:
            continue
        iface = ipaddress.ip_interface(parts[parts.index('inet') + 1])
        if iface.network.overlaps(TEST_NET):
            for i, net in enumerate(TEST_NET.subnets(new_prefix=24)):
                if net.overlaps(iface.network):
                    used.add(i)
    return used


def _no_ipv6(name):
    """Keep IPv6 (link-local addresses) off a root-namespace interface: the cluster speaks 198.18/15 only."""
    # A kernel setting, not a file: written in place (safe_files' rename cannot apply to /proc).
    path = '/proc/sys/net/ipv6/conf/{}/disable_ipv6'.format(name)
    if os.path.exists(path):
        with open(path, 'w') as f:
            f.write('1')


def make_netns(name, created=None):
    """Create the network namespace ``name`` with IPv6 off; call ``created()`` as soon as it exists."""
    ip('netns', 'add', name)
    if created is not None:
        created()
    if os.path.exists('/proc/sys/net/ipv6'):
        _run(['ip', 'netns', 'exec', name, 'sysctl', '-qw', 'net.ipv6.conf.all.disable_ipv6=1',
              'net.ipv6.conf.default.disable_ipv6=1'])


def make_bridge(name, address, prefixlen, created=None):
    """Create the bridge ``name`` holding the head address, and bring it up (``created()`` once it exists)."""
    ip('link', 'add', name, 'type', 'bridge')
    if created is not None:
        created()
    _no_ipv6(name)
    ip('addr', 'add', '{}/{}'.format(address, prefixlen), 'dev', name)
    ip('link', 'set', name, 'up')


def add_node_link(host_end, bridge, netns, address, prefixlen, created=None):
    """Connect ``netns`` to ``bridge`` with a veth (``eth0`` inside) holding ``address``; ``created()`` once made."""
    ip('link', 'add', host_end, 'type', 'veth', 'peer', 'name', NODE_IFACE, 'netns', netns)
    if created is not None:
        created()
    _no_ipv6(host_end)
    ip('link', 'set', host_end, 'master', bridge)
    ip('link', 'set', host_end, 'up')
    ip('addr', 'add', '{}/{}'.format(address, prefixlen), 'dev', NODE_IFACE, netns=netns)
    ip('link', 'set', 'lo', 'up', netns=netns)
    ip('link', 'set', NODE_IFACE, 'up', netns=netns)


def set_link_rate(host_end, netns, gbit):
    """Limit both directions of a node's veth to ``gbit`` Gbit/s with a token bucket (``tbf``)."""
    rate = '{}mbit'.format(max(1, int(round(gbit * 1000))))
    # The bucket must hold at least one timer tick of traffic at this rate (HZ >= 100 -> 10 ms).
    burst = max(64 * 1024, int(gbit * 1e9 / 8 * BURST_SECONDS))
    for ns in (None, netns):
        dev = host_end if ns is None else NODE_IFACE
        cmd = ['tc'] + (['-n', ns] if ns else []) + ['qdisc', 'replace', 'dev', dev, 'root', 'tbf',
                                                     'rate', rate, 'burst', str(burst), 'latency', '100ms']
        _run(cmd)


def set_netem(host_end, netns, gbit, delay_ms, loss_pct):
    """Delay and/or drop packets on both ends of a node's veth (``netem``, optionally rate-limited)."""
    opts = []
    if delay_ms is not None:
        opts += ['delay', '{}ms'.format(delay_ms)]
    if loss_pct is not None:
        opts += ['loss', '{}%'.format(loss_pct)]
    if gbit is not None:
        opts += ['rate', '{}mbit'.format(max(1, int(round(gbit * 1000))))]
    for ns in (None, netns):
        dev = host_end if ns is None else NODE_IFACE
        _run(['tc'] + (['-n', ns] if ns else []) + ['qdisc', 'replace', 'dev', dev, 'root', 'netem'] + opts)


def set_link(host_end, up):
    """Take a node's link down (``up=False``) or bring it back up."""
    ip('link', 'set', host_end, 'up' if up else 'down')


def link_counters(netns, iface=NODE_IFACE):
    """Return ``{'rx_bytes', 'tx_bytes', 'rx_packets', 'tx_packets'}`` of ``iface`` seen inside ``netns``."""
    out = ip('-s', '-j', 'link', 'show', 'dev', iface, netns=netns)
    stats = json.loads(out)[0]['stats64']
    return {'rx_bytes': stats['rx']['bytes'], 'tx_bytes': stats['tx']['bytes'],
            'rx_packets': stats['rx']['packets'], 'tx_packets': stats['tx']['packets']}


def delete_link(name):
    """Delete the interface ``name`` if it exists."""
    if os.path.exists(os.path.join('/sys/class/net', name)):
        ip('link', 'del', name, check=False)


def netns_exists(name):
    return os.path.exists(os.path.join('/run/netns', name))


def delete_netns(name):
    """Delete the network namespace ``name`` if it exists."""
    if netns_exists(name):
        ip('netns', 'del', name, check=False)


def netem_available():
    """Return True when the kernel offers the ``netem`` qdisc (delay, loss), tried on a scratch device."""
    name = 'cmnq{}'.format(os.getpid())
    try:
        ip('link', 'add', name, 'type', 'veth', 'peer', 'name', name + 'p')
    except NetError:
        return False
    try:
        res = subprocess.run(['tc', 'qdisc', 'add', 'dev', name, 'root', 'netem', 'delay', '1ms'],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return res.returncode == 0
    finally:
        ip('link', 'del', name, check=False)
