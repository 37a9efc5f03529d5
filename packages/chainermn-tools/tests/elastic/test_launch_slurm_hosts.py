"""``python -m chainermn launch`` inside a Slurm allocation: hosts and ranks per node from Slurm.

No daemons: a fake ``scontrol`` on PATH expands the node list (and says the job's current NodeList,
read from a file the test rewrites), and a fake ``mpiexec`` records its command lines and fails the
probe of hosts marked down.
"""

import os
import subprocess
import sys

import pytest

from chainermn_tools.launch import _slurm

TIMEOUT = 120

FAKE_SCONTROL = '''#!/bin/sh
echo "$*" >> "%(dir)s/scontrol.log"
case "$1 $2" in
  "show job") echo "JobId=$4 JobName=x NodeList=$(cat "%(dir)s/nodelist") BatchHost=nodea";;
  "show hostnames") case "$3" in
      "node[a-b]") printf 'nodea\\nnodeb\\n';;
      "node[a-c]") printf 'nodea\\nnodeb\\nnodec\\n';;
      "nodea") echo nodea;;
      *) echo "scontrol: error: bad list $3" >&2; exit 1;;
    esac;;
  *) exit 1;;
esac
'''

FAKE_MPIEXEC = '''#!/bin/sh
echo "$*" >> "%(dir)s/mpiexec.log"
if [ "$1" = -hosts ] && [ "$3 $4 $5" = "-n 1 nproc" ] && [ -e "%(dir)s/down.$2" ]; then
  echo "srun: error: Unable to create step for job: Node $2 is DOWN" >&2; exit 1
fi
if [ "$3 $4 $5" = "-n 1 nproc" ]; then echo 4; fi
exit 0
'''


@pytest.fixture
def fake(tmp_path):
    """Return (dir, env) with the fake scontrol first on PATH and an allocation of nodea, nodeb."""
    for name, text in (('scontrol', FAKE_SCONTROL), ('mpiexec', FAKE_MPIEXEC)):
        path = tmp_path / name
        path.write_text(text % {'dir': tmp_path})
        path.chmod(0o755)
    (tmp_path / 'nodelist').write_text('node[a-b]')
    env = {k: v for k, v in os.environ.items() if not k.startswith('SLURM_')}
    env.update(PATH='{}:{}'.format(tmp_path, env.get('PATH', '')), SLURM_JOB_ID='42',
               SLURM_JOB_NODELIST='node[a-b]', SLURM_TASKS_PER_NODE='2(x2)')
    return tmp_path, env


def test_allocation_hosts_asks_slurm_each_time(fake):
    tmp, env = fake
    assert _slurm.allocation_hosts(env) == ['nodea', 'nodeb']
    (tmp / 'nodelist').write_text('node[a-c]')           # the job's node list changed
    assert _slurm.allocation_hosts(env) == ['nodea', 'nodeb', 'nodec']
    log = (tmp / 'scontrol.log').read_text().splitlines()
    assert log == ['show job -o 42', 'show hostnames node[a-b]', 'show job -o 42',
                   'show hostnames node[a-c]']


def test_allocation_hosts_without_job_id_uses_the_environment(fake):
    tmp, env = fake
    del env['SLURM_JOB_ID']
    env['SLURM_JOB_NODELIST'] = 'nodea'
    assert _slurm.allocation_hosts(env) == ['nodea']
    env['SLURM_JOB_NODELIST'] = 'bad[1'
    with pytest.raises(OSError, match='bad list'):
        _slurm.allocation_hosts(env)


@pytest.mark.parametrize('env, want', [
    ({'SLURM_NTASKS_PER_NODE': '3', 'SLURM_TASKS_PER_NODE': '2(x2)'}, 3),
    ({'SLURM_TASKS_PER_NODE': '2(x2)'}, 2),
    ({'SLURM_TASKS_PER_NODE': '4,2(x3),3'}, 2),
    ({'SLURM_TASKS_PER_NODE': '12'}, 12),
    ({}, None),
    ({'SLURM_TASKS_PER_NODE': ''}, None),
])
def test_ranks_per_node_from_slurm(env, want):
    assert _slurm.ranks_per_node(env) == want


def _launch(env, *args):
    cmd = [sys.executable, '-m', 'chainermn_tools', 'launch'] + list(args)
    proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=TIMEOUT)
    return proc.returncode, proc.stderr.decode(errors='replace')


def test_launch_outside_slurm_without_hosts_file_exits_2(fake):
    _, env = fake
    for k in ('SLURM_JOB_ID', 'SLURM_JOB_NODELIST', 'SLURM_TASKS_PER_NODE'):
        del env[k]
    rc, err = _launch(env, '--ranks-per-node', '1', '--min-nodes', '1', '--', 'true')
    assert rc == 2, err
    assert 'no --hosts-file given and not inside a Slurm allocation' in err


def test_launch_takes_hosts_and_ranks_from_the_allocation(fake):
    tmp, env = fake
    (tmp / 'down.nodeb').write_text('')
    rc, err = _launch(env, '--min-nodes', '1', '--heartbeat', '0', '--mpiexec', str(tmp / 'mpiexec'),
                      '--', 'myjob', 'arg')
    assert rc == 0, err
    assert 'host nodeb left out: probe exited with status 1: srun: error' in err
    runs = (tmp / 'mpiexec.log').read_text().splitlines()
    assert sorted(runs[:2]) == ['-hosts nodea -n 1 nproc', '-hosts nodeb -n 1 nproc']
    # The probe counts 4 CPUs on nodea: its 2 ranks get a core each.
    assert runs[2:] == ['-bind-to core -hosts nodea -ppn 2 -n 2 myjob arg']


def test_launch_requeries_the_allocation_at_a_restart(fake):
    tmp, env = fake
    env['SLURM_NTASKS_PER_NODE'] = '1'
    job = tmp / 'job.sh'                                   # fails the first time, then succeeds
    job.write_text('#!/bin/sh\n[ -e "{0}/ran" ] && exit 0\ntouch "{0}/ran"; exit 3\n'.format(tmp))
    job.chmod(0o755)
    mpiexec = tmp / 'mpiexec'
    mpiexec.write_text(FAKE_MPIEXEC.replace('exit 0\n', '') % {'dir': tmp} +
                       'case "$*" in *job.sh) echo "node[a-c]" > "{0}/nodelist"; exec "{1}";; esac\n'
                       'exit 0\n'.format(tmp, job))
    rc, err = _launch(env, '--min-nodes', '2', '--heartbeat', '0', '--mpiexec', str(mpiexec),
                      '--', str(job))
    assert rc == 0, err
    runs = [r for r in (tmp / 'mpiexec.log').read_text().splitlines() if not r.endswith(' nproc')]
    assert runs == ['-bind-to core -hosts nodea,nodeb -ppn 1 -n 2 {}'.format(job),
                    '-bind-to core -hosts nodea,nodeb,nodec -ppn 1 -n 3 {}'.format(job)], err
    assert 'restart 1: hosts dropped: none; added: nodec' in err
