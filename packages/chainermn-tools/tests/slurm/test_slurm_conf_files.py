"""``write_config`` writes through the safe writer into directories only this user can write (no Slurm needed)."""

import os
import stat

import pytest

from chainermn_comm.safe_files import UntrustedPathError
from chainermn_tools.slurm import write_config

NODES = [('node0', '198.18.0.2'), ('node1', '198.18.0.3')]


def test_files_and_modes(tmp_path):
    root = str(tmp_path / 'slurm')
    files = write_config(root, NODES, head_addr='198.18.0.1')
    assert stat.S_IMODE(os.stat(root).st_mode) & 0o077 == 0
    assert stat.S_IMODE(os.stat(os.path.dirname(files.munge_key)).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(files.munge_key).st_mode) == 0o400
    assert os.path.getsize(files.munge_key) == 1024
    with open(files.slurm_conf) as f:
        conf = f.read()
    assert 'NodeName=node1 NodeAddr=198.18.0.3' in conf and 'SlurmctldHost=head(198.18.0.1)' in conf
    key = open(files.munge_key, 'rb').read()
    write_config(root, NODES, head_addr='198.18.0.1')          # again: the key is kept
    assert open(files.munge_key, 'rb').read() == key


def test_planted_symlink_is_replaced_not_followed(tmp_path):
    root = tmp_path / 'slurm'
    (root / 'etc').mkdir(parents=True)
    victim = tmp_path / 'victim'
    victim.write_text('keep')
    (root / 'etc' / 'slurm.conf').symlink_to(victim)
    files = write_config(str(root), NODES)
    assert victim.read_text() == 'keep' and not os.path.islink(files.slurm_conf)


@pytest.mark.skipif(os.geteuid() != 0, reason='needs root to act as another user')
def test_directory_of_another_user_is_refused(tmp_path):
    root = tmp_path / 'slurm'
    root.mkdir(mode=0o700)
    os.chown(str(root), 65534, 65534)           # made by uid 65534 first
    with pytest.raises(UntrustedPathError, match='uid 65534'):
        write_config(str(root), NODES)
    assert os.listdir(str(root)) == []


def test_world_writable_subdirectory_is_refused(tmp_path):
    root = tmp_path / 'slurm'
    (root / 'log').mkdir(parents=True)
    os.chmod(str(root / 'log'), 0o777)
    with pytest.raises(UntrustedPathError, match='other users can write it'):
        write_config(str(root), NODES)
