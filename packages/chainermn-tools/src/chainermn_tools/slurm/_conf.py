"""Write slurm.conf, cgroup.conf and a MUNGE key for a small test cluster."""

import collections
import os

from chainermn_comm import safe_files

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


def _private_dir(path, mode=0o700):
    """Make ``path`` (its parent must exist) or check that it is this user's and only this user writes it."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    # The daemons run as root with what this directory holds (the MUNGE key, their state): a
    # directory another user can write is refused, whatever CHAINERMN_TRUST_SHARED says.
    safe_files.check_directory(path, 'Slurm directory', allow_shared=False)


def write_config(root, nodes, head='head', head_addr='127.0.0.1', cpus=None, cluster='chainermn',
                 mpi_default='pmi2', ctld_port=6817, slurmd_port=6818, extra=()):
    """Write the configuration of one slurmctld on ``head`` and a slurmd per node; return SlurmFiles.

    Everything (spool, state, logs, pid files, the MUNGE key and socket) lives under ``root``, so
    the daemons touch nothing of the host; ``root`` (made if missing, its parent must exist) and
    every directory under it must be this user's and writable by nobody else, and every file is
    written through ``chainermn_comm.safe_files``. Nodes use ``proctrack/linuxproc``, ``task/none`` and a
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
    _private_dir(files.root)
    for d in (os.path.dirname(files.slurm_conf), files.log_dir, files.run_dir, files.spool_dir,
              files.state_dir):
        _private_dir(d, 0o755)
    _private_dir(os.path.dirname(files.munge_key), 0o700)
    if os.path.lexists(files.munge_key):
        safe_files.check_file(os.lstat(files.munge_key), files.munge_key, 'MUNGE key', allow_shared=False)
    else:
        safe_files.write_bytes(files.munge_key, os.urandom(1024), mode=0o400)
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
    safe_files.write_text(files.slurm_conf, '\n'.join(lines) + '\n', mode=0o644)
    safe_files.write_text(files.cgroup_conf, 'CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n', mode=0o644)
    return files
