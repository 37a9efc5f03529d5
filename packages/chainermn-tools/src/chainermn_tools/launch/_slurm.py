"""Take the launcher's hosts and ranks per node from the Slurm allocation it runs in."""

import re
import subprocess

__all__ = ['nodelist', 'allocation_hosts', 'ranks_per_node']

_TIMEOUT = 30


def nodelist(env):
    """Return the allocation's node list (``SLURM_JOB_NODELIST`` or ``SLURM_NODELIST``), or None."""
    return env.get('SLURM_JOB_NODELIST') or env.get('SLURM_NODELIST') or None


def _scontrol(args, env):
    try:
        proc = subprocess.run(['scontrol'] + args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=env, timeout=_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise OSError('scontrol {} gave no answer within {} s'.format(' '.join(args), _TIMEOUT))
    if proc.returncode != 0:
        raise OSError('scontrol {} exited with status {}: {}'.format(
            ' '.join(args), proc.returncode, proc.stderr.decode(errors='replace').strip()[:200]))
    return proc.stdout.decode(errors='replace')


def _current_nodelist(env):
    """Ask Slurm for the job's node list now (it may have shrunk); fall back to the environment."""
    job = env.get('SLURM_JOB_ID') or env.get('SLURM_JOBID')
    if job:
        try:
            m = re.search(r'(?:^|\s)NodeList=(\S+)', _scontrol(['show', 'job', '-o', job], env))
        except OSError:
            m = None
        if m and m.group(1) not in ('(null)', ''):
            return m.group(1)
    return nodelist(env)


def allocation_hosts(env):
    """Return the host names of the allocation (``scontrol show hostnames``), once each, in order.

    Raises ``OSError`` when ``scontrol`` cannot be run or fails.
    """
    hosts = []
    for host in _scontrol(['show', 'hostnames', _current_nodelist(env)], env).split():
        if host not in hosts:
            hosts.append(host)
    return hosts


def ranks_per_node(env):
    """Return the tasks per node of the allocation, or None when Slurm does not say.

    ``SLURM_NTASKS_PER_NODE`` first; else ``SLURM_TASKS_PER_NODE`` (``2(x3)``, ``4,2``: the fewest,
    so no node gets more ranks than Slurm gave it).
    """
    value = env.get('SLURM_NTASKS_PER_NODE', '').strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    counts = [int(n) for n in re.findall(r'(\d+)(?:\(x\d+\))?(?:,|$)', env.get('SLURM_TASKS_PER_NODE', ''))]
    counts = [n for n in counts if n > 0]
    return min(counts) if counts else None
