"""CHAINERMN_TRACE and the launch status file against another user (uid 65534), root jobs of 2 ranks.

- A trace directory that is a regular file, cannot be made (``/proc/nope``) or belongs to another
  user is refused at start, on every rank, naming the variable (it was ignored silently).
- Symlinks planted at every name the trace writes (parts, the merged trace, its lock) are never
  followed: the parts and the merged trace replace them, a planted lock stops the merge.
- The launch status file replaces a planted symlink and is not read from another user's file.
"""

import json
import os
import stat

from chainermn_comm import launch_status
from chainermn_comm.testing import run_mpi

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, 'jobs', 'sec_trace_job.py')
LINKS = r'''
import os, sys
target = sys.argv[1]
for path in sys.argv[2:]:
    os.symlink(target, path)
'''


def _report(res):
    return 'exit {}\n--- stdout ---\n{}\n--- stderr ---\n{}'.format(res.returncode, res.stdout[-3000:],
                                                                     res.stderr[-5000:])


def test_bad_trace_directories_are_refused_at_start_on_every_rank(base):
    regular = os.path.join(base, 'a-file')
    with open(regular, 'w') as f:
        f.write('x')
    theirs = os.path.join(base, 'theirs')
    os.mkdir(theirs, 0o755)
    os.chown(theirs, 65534, 65534)   # another user's directory
    out = os.path.join(base, 'out')
    values = [regular, '/proc/nope', theirs]
    res = run_mpi([JOB, 'bad', out] + values, 2, timeout=120, env={'CHAINERMN_TRACE': ''})
    assert res.returncode == 0, _report(res)
    got = {}
    for r in (0, 1):
        with open('{}.{}'.format(out, r)) as f:
            for line in f:
                doc = json.loads(line)
                got.setdefault(doc['value'], {})[r] = doc
    expect = {regular: 'it is not a directory', '/proc/nope': 'cannot create it',
              theirs: 'owned by another user'}
    for value, words in expect.items():
        docs = got[value]
        assert sorted(docs) == [0, 1], got
        for r, doc in docs.items():
            assert doc['error'][0] == 'ValueError', doc
            assert doc['error'][1].startswith('rank 0: CHAINERMN_TRACE={!r} cannot be used'.format(value)), doc
            assert words in doc['error'][1], doc
            assert doc['works_unset'] is True
        assert docs[0]['error'] == docs[1]['error']
    assert os.listdir(theirs) == []    # nothing written into the other user's directory


def test_planted_symlinks_at_trace_names_are_never_followed(base, shared_dir, as_nobody, secret):
    plain, locked = shared_dir('plain'), shared_dir('locked')
    as_nobody(LINKS, secret, *[os.path.join(plain, n) for n in
                               ('trace.rank0.json', 'trace.rank1.json', 'trace.json')])
    as_nobody(LINKS, secret, *[os.path.join(locked, n) for n in ('trace.json', '.trace.lock')])
    for d in (plain, locked):
        res = run_mpi([JOB, 'trace'], 2, timeout=120,
                      env={'CHAINERMN_TRACE': d, 'CHAINERMN_TRUST_SHARED': '1'})
        assert res.returncode == 0, _report(res)
        for r in (0, 1):
            st = os.lstat(os.path.join(d, 'trace.rank{}.json'.format(r)))
            assert stat.S_ISREG(st.st_mode) and st.st_uid == 0, d
        if d == plain:
            st = os.lstat(os.path.join(d, 'trace.json'))
            assert stat.S_ISREG(st.st_mode) and st.st_uid == 0
            with open(os.path.join(d, 'trace.json')) as f:
                assert json.load(f)['otherData']['size'] == 2
        else:   # the planted lock stops the merge, said once per rank that tried
            assert os.path.islink(os.path.join(d, 'trace.json'))
            assert 'the trace could not be written' in res.stderr and 'symbolic link' in res.stderr, \
                _report(res)
    with open(secret, 'rb') as f:
        assert f.read() == b'root only'
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600


def test_launch_status_file_never_follows_or_reads_another_users_file(shared_dir, as_nobody, secret):
    d = shared_dir('launch')
    path = os.path.join(d, 'status.json')
    as_nobody(LINKS, secret, path)
    launch_status.LaunchStatusWriter(path).update(generation=3)
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode) and st.st_uid == 0
    assert launch_status.read_launch_status(path) == {'generation': 3}
    theirs = os.path.join(d, 'theirs.json')
    as_nobody('import sys; open(sys.argv[1], "w").write(\'{"generation": 99}\')', theirs)
    assert launch_status.read_launch_status(theirs) == {}   # another user's file is not read
    with open(secret, 'rb') as f:
        assert f.read() == b'root only'
