"""Write slurm.conf, cgroup.conf and a MUNGE key for a small test cluster."""

import collections
import os

__all__ = ['Node', 'SlurmFiles', 'write_config']

#: One compute node: its name (slurmd -N / hostname) and the address slurmctld reaches it on.
Node = collections.namedtuple('Node', ['name', 'addr'])

#: Where write_config() put everything; all paths are absolute.
SlurmFiles = collections.namedtuple('SlurmFiles', [
    'root', 'slurm_conf', 'cgroup_conf', 'munge_key', 'munge_socket', 'log_dir', 'run_dir',
    'spool_dir', 'state_dir'])


def _files(root):
    root = os.path.abspath(root)
    etc, munge = os.path.join(root, 'etc'), os.path.join(root, 'munge')
    return SlurmFiles(root=root, slurm_conf=os.path.join(etc, 'slurm.conf'),
                      cgroup_conf=os.path.join(etc, 'cgroup.conf'),
                      munge_key=os.path.join(munge, 'munge.key'),
                      munge_socket=os.path.join(munge, 'munge.socket'),
                      log_dir=os.path.join(root, 'log'), run_dir=os.path.join(root, 'run'),
                      spool_dir=os.path.join(root, 'spool'), state_dir=os.path.join(root, 'state'))


def write_config(root, nodes, head='head', head_addr='127.0.0.1', cpus=None, cluster='chainermn',
                 mpi_default='pmi2', ctld_port=6817, slurmd_port=6818, extra=()):
    """Write the configuration of one slurmctld on ``head`` and a slurmd per node; return SlurmFiles.

    Everything (spool, state, logs, pid files, the MUNGE key and socket) lives under ``root``, so
    the daemons touch nothing of the host. Nodes use ``proctrack/linuxproc``, ``task/none`` and a
    cgroup/v1 plugin that never mounts anything (it expects a tmpfs over /sys/fs/cgroup in the
    node's mount namespace). ``cpus`` per node defaults to max(4, CPUs of this machine) and is
    trusted over what slurmd detects, so ``-n 4 -N 2`` fits on a 2-core machine.
    """
    nodes = [Node(*n) for n in nodes]
    if not nodes:
        raise ValueError('write_config needs at least one node')
    names = [n.name for n in nodes]
    if len(set(names)) != len(names) or head in names:
        raise ValueError('node names must be unique and differ from the head {!r}: {}'.format(
            head, names))
    files = _files(root)
    for d in (os.path.dirname(files.slurm_conf), os.path.dirname(files.munge_key), files.log_dir,
              files.run_dir, files.spool_dir, files.state_dir):
        os.makedirs(d, exist_ok=True)
    os.chmod(os.path.dirname(files.munge_key), 0o700)
    if not os.path.exists(files.munge_key):
        fd = os.open(files.munge_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
        with os.fdopen(fd, 'wb') as f:
            f.write(os.urandom(1024))
    cpus = cpus or max(4, os.cpu_count() or 1)
    lines = [
        'ClusterName={}'.format(cluster),
        'SlurmctldHost={}({})'.format(head, head_addr),
        'SlurmctldPort={}'.format(ctld_port),
        'SlurmdPort={}'.format(slurmd_port),
        'SlurmUser=root',
        'SlurmdUser=root',
        'AuthType=auth/munge',
        'CredType=cred/munge',
        'AuthInfo=socket={}'.format(files.munge_socket),
        'StateSaveLocation={}'.format(files.state_dir),
        'SlurmdSpoolDir={}/%n'.format(files.spool_dir),
        'SlurmctldPidFile={}/slurmctld.pid'.format(files.run_dir),
        'SlurmdPidFile={}/slurmd-%n.pid'.format(files.run_dir),
        'SlurmctldLogFile={}/slurmctld.log'.format(files.log_dir),
        'SlurmdLogFile={}/slurmd-%n.log'.format(files.log_dir),
        'SlurmctldDebug=info',
        'SlurmdDebug=info',
        'ProctrackType=proctrack/linuxproc',
        'TaskPlugin=task/none',
        'SelectType=select/cons_tres',
        'SelectTypeParameters=CR_Core',
        'SlurmdParameters=config_overrides',
        'MpiDefault={}'.format(mpi_default),
        'ReturnToService=2',
        'JobRequeue=1',
        'SchedulerType=sched/backfill',
        'JobAcctGatherType=jobacct_gather/none',
        'AccountingStorageType=accounting_storage/none',
        'InactiveLimit=0',
        'KillWait=5',
    ] + list(extra)
    lines += ['NodeName={} NodeAddr={} CPUs={} State=UNKNOWN'.format(n.name, n.addr, cpus)
              for n in nodes]
    lines.append('PartitionName=main Nodes={} Default=YES MaxTime=INFINITE State=UP '
                 'OverSubscribe=YES'.format(','.join(names)))
    with open(files.slurm_conf, 'w') as f:
        f.write('\n'.join(lines) + '\n')
    with open(files.cgroup_conf, 'w') as f:
        f.write('CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n')
    return files
