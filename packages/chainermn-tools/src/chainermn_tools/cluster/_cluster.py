"""``Cluster``: N nodes made of namespaces on this machine, joined by a bridge, with MPI across them."""

import collections
import functools
import os
import signal
import subprocess
import sys
import tempfile
import warnings

from chainermn_comm import protocol

from chainermn_tools.cluster import _hosts, _net, _node, _proofs, _registry, _state, _support, _teardown

__all__ = ['Cluster', 'Node', 'NODE_LOCAL_ENV']

#: Environment variable that gives a job the node-local scratch directory.
NODE_LOCAL_ENV = protocol.NODE_LOCAL_ENV
#: Environment variable that tags the processes of one ``Cluster.mpiexec`` job (to clean up after it).
JOB_ENV = protocol.CLUSTER_JOB_ENV
HEAD_NAME = 'head'

Node = collections.namedtuple('Node', ['index', 'hostname', 'address', 'netns', 'link', 'holder_pid',
                                       'scratch'])
Node.__doc__ = """A node: ``hostname`` (``nodeI``), ``address`` on the cluster subnet, network namespace
``netns``, host end ``link`` of its veth, ``holder_pid`` (its PID 1 seen from here) and ``scratch``,
the host path of its node-local directory (inside the node it is at ``Cluster.node_local``)."""


class Cluster(object):
    """A cluster of ``nodes`` nodes on this machine; a context manager that always removes it.

    Each node has its own network (a veth to a bridge, addresses from 198.18.0.0/15), hostname
    (``node0``, ``node1``, ... resolvable on every node), IPC and mount namespaces with a private
    ``/dev/shm`` and a node-local scratch directory, and PID namespace.  ``link_gbit`` limits each
    node's link in both directions; ``delay_ms``/``loss_pct`` need the kernel's ``netem``.
    """

    def __init__(self, nodes=2, link_gbit=None, delay_ms=None, loss_pct=None, start_timeout=60.0):
        if int(nodes) < 1 or int(nodes) > 250:
            raise ValueError('nodes must be between 1 and 250, got {}'.format(nodes))
        if link_gbit is not None and not link_gbit > 0:
            raise ValueError('link_gbit must be positive, got {}'.format(link_gbit))
        self.size = int(nodes)
        self.link_gbit = link_gbit
        self.delay_ms = delay_ms
        self.loss_pct = loss_pct
        self.start_timeout = start_timeout
        self.nodes = []
        self.prefix = self.subnet = self.head_address = self.node_local = self.launcher = None
        self._state = None
        self._base = None
        self._holders = []
        self._jobs = 0

    # -- lifecycle ------------------------------------------------------------------------------
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def start(self):
        """Build the nodes (after sweeping this registry's dead clusters); raise ClusterUnavailable if impossible."""
        if self._state is not None:
            raise RuntimeError('cluster {} is already started'.format(self.prefix))
        shaped = self.delay_ms is not None or self.loss_pct is not None
        _support.require(need_tc=self.link_gbit is not None or shaped)
        if shaped and not _net.netem_available():
            raise _support.ClusterUnavailable(
                'link delay/loss needs the `netem` qdisc, which this kernel does not have '
                '(sch_netem); only --link-gbit (tbf) is available here')
        with _registry.locked() as base:
            states, refused = _registry.read_states(base, functools.partial(_state.validate, base))
            live = _teardown.sweep(base, states)
            # Names on this machine that another registry, user or older chainermn uses are taken too.
            taken = ({s['index'] for s in live.values()} | {_registry.index_of(p) for p in refused}
                     | _net.used_subnets() | _registry.names_in_use())
            index = _registry.pick_index(taken)
            if index is None:
                raise _support.ClusterUnavailable('every /24 of 198.18.0.0/15 is in use by other clusters')
            self.prefix = prefix = _registry.prefix_for(index)
            net = _net.subnet(index)
            self.subnet = str(net)
            self._base = base
            self._dir = _registry.make_state_dir(base, prefix)
            self._state = _state.new_state(base, prefix, index, net, self.size)
            _registry.write_state(base, self._state)
        try:
            self._build(net.prefixlen)
        except BaseException:
            self.close()
            raise
        return self

    def _record(self, rec, **identity):
        """Record what was just created (and how to recognise it) before anything else happens."""
        rec.update(identity)
        _registry.write_state(self._base, self._state)

    def _build(self, prefixlen):
        st = self._state
        self.head_address = st['head_address']
        scratch = tempfile.mkdtemp(prefix='chainermn-{}-'.format(self.prefix), dir=_registry.SCRATCH_PARENT)
        self._record(st, scratch=scratch, scratch_id=_proofs.dir_id(scratch))
        self.node_local = os.path.join(scratch, 'local')
        nodes_dir = os.path.join(scratch, 'nodes')
        os.mkdir(self.node_local, 0o755)
        os.mkdir(nodes_dir, 0o755)
        _net.make_bridge(st['bridge'], st['head_address'], prefixlen, created=lambda: self._record(
            st, bridge_ifindex=_proofs.link_ifindex(st['bridge'])))
        text = _hosts.hosts_text(HEAD_NAME, st['head_address'], [n['hostname'] for n in st['nodes']],
                                 [n['address'] for n in st['nodes']])
        for rec in st['nodes']:
            netns = rec['netns']
            _net.make_netns(netns, created=lambda: self._record(rec, netns_id=_proofs.netns_id(netns)))
            _hosts.write_netns_hosts(netns, text, created=lambda d: self._record(rec, etc_id=_proofs.dir_id(d)))
            _net.add_node_link(rec['link'], st['bridge'], netns, rec['address'], prefixlen,
                               created=lambda: self._record(rec, link_ifindex=_proofs.link_ifindex(rec['link'])))
            self._shape(rec)
            node_scratch = os.path.join(nodes_dir, rec['hostname'])
            os.mkdir(node_scratch, 0o755)
            proc, pid, start = _node.start_holder(
                netns, rec['hostname'], node_scratch, self.node_local, nodes_dir,
                os.path.join(self._dir, rec['hostname'] + '.log'), timeout=self.start_timeout,
                env={_proofs.TOKEN_ENV: st['token']})
            self._holders.append(proc)
            self._record(rec, holder_pid=pid, holder_start=start)
            self.nodes.append(Node(len(self.nodes), rec['hostname'], rec['address'], netns,
                                   rec['link'], pid, node_scratch))
        self.launcher = _hosts.write_launcher(os.path.join(self._dir, 'launcher'), self.prefix,
                                              self.hostnames, [n.holder_pid for n in self.nodes])

    def _shape(self, rec):
        if self.delay_ms is not None or self.loss_pct is not None:
            _net.set_netem(rec['link'], rec['netns'], self.link_gbit, self.delay_ms, self.loss_pct)
        elif self.link_gbit is not None:
            _net.set_link_rate(rec['link'], rec['netns'], self.link_gbit)

    def close(self):
        """Kill every node and remove everything the cluster created (safe to call twice)."""
        if self._state is None:
            return
        state, self._state = self._state, None
        try:
            with _registry.locked() as base:
                recorded, _ = _registry.read_state(base, state['prefix'])
                if isinstance(recorded, dict) and recorded.get('token') == state['token']:
                    _teardown.teardown(base, state)
                else:       # swept by a run that took this process for dead: its names may be reused
                    warnings.warn('chainermn cluster: cluster {} was already removed by another run; '
                                  'nothing is removed now'.format(state['prefix']))
        except _registry.RegistryRefused as e:
            warnings.warn('{} Removing cluster {} without it; its state directory stays.'.format(
                e, state['prefix']))
            _teardown.teardown(None, state)
        for proc in self._holders:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self._holders = []

    # -- facts ----------------------------------------------------------------------------------
    @property
    def hostnames(self):
        return [n.hostname for n in self.nodes]

    @property
    def addresses(self):
        return [n.address for n in self.nodes]

    def _node(self, node):
        return self.nodes[node.index if isinstance(node, Node) else int(node)]

    # -- running things on one node -------------------------------------------------------------
    def command(self, node, argv, cwd=None):
        """Return the argv that runs ``argv`` on ``node`` (index or Node), in ``cwd`` there."""
        return _node.enter_command(self._node(node).holder_pid, argv, cwd=cwd or os.getcwd())

    def env(self, extra=None):
        """Return the environment a job gets: this one, ``CHAINERMN_NODE_LOCAL``, this Python's bin first on PATH."""
        env = dict(os.environ)
        env[NODE_LOCAL_ENV] = self.node_local
        env['PATH'] = os.pathsep.join([os.path.dirname(sys.executable)] + [
            p for p in env.get('PATH', '').split(os.pathsep) if p and p != os.path.dirname(sys.executable)])
        for k, v in (extra or {}).items():
            if v is None:
                env.pop(k, None)  # None removes a variable
            else:
                env[k] = str(v)
        return env

    def popen(self, node, argv, env=None, cwd=None, **kwargs):
        """Start ``argv`` on ``node``; return the Popen."""
        return subprocess.Popen(self.command(node, argv, cwd), env=self.env(env), **kwargs)

    def run(self, node, argv, env=None, cwd=None, timeout=60, **kwargs):
        """Run ``argv`` on ``node``; return the CompletedProcess (text output captured unless redirected)."""
        kwargs.setdefault('stdout', subprocess.PIPE)
        kwargs.setdefault('stderr', subprocess.PIPE)
        kwargs.setdefault('stdin', subprocess.DEVNULL)
        kwargs.setdefault('text', True)
        return subprocess.run(self.command(node, argv, cwd), env=self.env(env), timeout=timeout, **kwargs)

    def processes(self, node):
        """Return ``[(pid, ppid, comm)]`` of the processes running on ``node`` (its PID 1 left out)."""
        return _node.node_processes(self._node(node).holder_pid)

    def kill(self, node, sig=signal.SIGKILL, ranks_only=False):
        """Send ``sig`` to every process of ``node`` (``ranks_only``: the job's, not MPI's proxy); return pids."""
        return _node.signal_processes(self._node(node).holder_pid, sig, ranks_only=ranks_only)

    def link_down(self, node):
        """Take ``node``'s network link down (its peers see it vanish)."""
        _net.set_link(self._node(node).link, False)

    def link_up(self, node):
        """Bring ``node``'s network link back up."""
        _net.set_link(self._node(node).link, True)

    def counters(self, node, iface=_net.NODE_IFACE):
        """Return the byte and packet counters of ``iface`` (``eth0``: its link; ``lo``) seen inside ``node``."""
        return _net.link_counters(self._node(node).netns, iface)

    # -- MPI across nodes -----------------------------------------------------------------------
    def mpiexec_args(self, ranks_per_node=1):
        """Return the mpiexec options that start ``ranks_per_node`` ranks on every node (Hydra).

        Each rank is bound to a CPU of its own where this machine's CPUs (this process's affinity)
        suffice for all the ranks of all the nodes; otherwise the ranks are not bound.
        """
        slices = _hosts.core_slices(os.sched_getaffinity(0), self.size, ranks_per_node)
        hostfile = _hosts.write_hostfile(os.path.join(self._dir, 'hosts.{}'.format(ranks_per_node)),
                                         self.hostnames, ranks_per_node, slices)
        return ['-launcher', 'ssh', '-launcher-exec', self.launcher, '-f', hostfile,
                '-localhost', self.head_address, '-genv', NODE_LOCAL_ENV, self.node_local]

    def mpiexec_command(self, argv, ranks_per_node=1, mpiexec=None):
        """Return the full ``mpiexec`` argv that runs ``argv`` as nodes x ``ranks_per_node`` ranks."""
        from chainermn_comm.mpirun import find_mpiexec
        mpiexec = mpiexec or find_mpiexec()
        _support.require_hydra(mpiexec)
        return ([mpiexec, '-n', str(self.size * ranks_per_node)]
                + self.mpiexec_args(ranks_per_node) + [str(a) for a in argv])

    def mpiexec(self, args, ranks_per_node=1, timeout=120, env=None, cwd=None, python=True,
                on_start=None, mpiexec_args=()):
        """Run ``[python] args`` on every node under mpiexec with a hard timeout; return an MpiResult.

        On timeout every process left on the nodes is killed.
        """
        from chainermn_comm.mpirun import run_mpi
        self._jobs += 1
        tag = '{}.{}.{}'.format(self.prefix, os.getpid(), self._jobs)
        env = dict(env or {}, **{JOB_ENV: tag})
        removed = {k: None for k, v in env.items() if v is None}  # run_mpi removes them too
        env = {k: v for k, v in self.env(env).items() if os.environ.get(k) != v}
        env.update(removed)
        try:
            return run_mpi(args, self.size * ranks_per_node, timeout=timeout, env=env, cwd=cwd,
                           python=python, on_start=on_start,
                           mpiexec_args=self.mpiexec_args(ranks_per_node) + list(mpiexec_args))
        finally:
            self.kill_job(tag)

    def kill_job(self, tag, sig=signal.SIGKILL):
        """Send ``sig`` to what is left on the nodes of the job tagged ``tag`` (``$CHAINERMN_CLUSTER_JOB``)."""
        entry = '{}={}'.format(JOB_ENV, tag).encode()
        pids = [pid for node in self.nodes
                for pid in _node.signal_processes(node.holder_pid, sig, env_entry=entry)]
        if sig == signal.SIGKILL:
            _node.wait_gone(pids)
        return pids
