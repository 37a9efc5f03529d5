"""Another user (uid 65534) plants files against a root job of 2 ranks: checkpoints and snapshots.

One launch runs every case (``jobs/sec_ckpt_job.py``); each must end with the clear refusal on
every rank, or load only the job's own files with a warning, and never overwrite, load or delete
what is not the job's own.  Cases: a generation planted in a 1777 directory; symlinks at the
snapshot names, at the owner records and at a newer generation; poisoned (pickled) npz through
the checkpointer and ``multi_node_snapshot``; stray names (``run.0.²``); a renamed generation; an
Adam -> MomentumSGD swap; compression bombs (a truthful and a lying zip entry, an outlier among
its generation, and through ``multi_node_snapshot``).
"""

import io
import json
import os
import re
import stat
import struct
import zlib

import numpy
import pytest

from chainermn_comm.testing import run_mpi

HERE = os.path.dirname(os.path.abspath(__file__))
JOB = os.path.join(HERE, 'jobs', 'sec_ckpt_job.py')
GIB = 1 << 30
#: What every member of a snapshot of the job's model (a Linear(3, 2) as ``l1``) holds.
SHAPES = {'l1/W': (2, 3), 'l1/b': (2,)}

# Planting as uid 65534: one operation per line of a JSON list.
PLANT = r'''
import json, os, shutil, sys
import numpy
ops = json.loads(sys.argv[1])

class Payload:
    def __init__(self, marker):
        self.marker = marker
    def __reduce__(self):
        return (os.system, ('touch ' + self.marker,))

for op in ops:
    kind, path = op[0], op[1]
    if kind == 'symlink':
        os.symlink(op[2], path)
    elif kind == 'copy':
        shutil.copyfile(op[2], path)
    elif kind == 'text':
        with open(path, 'w') as f:
            f.write(op[2])
    elif kind == 'snapshot':       # a valid-looking snapshot: op[2] = {key: [shape, value]}, op[3] = meta
        arrays = {k: numpy.full(tuple(s), v, numpy.float32) for k, (s, v) in op[2].items()}
        arrays['__chainermn_format__'] = numpy.int64(1)
        arrays['__chainermn_none__'] = numpy.zeros(0, '<U1')
        for k, v in op[3].items():
            arrays['__chainermn_meta__/' + k] = numpy.asarray(v)
        with open(path, 'wb') as f:
            numpy.savez(f, **arrays)
    elif kind == 'poison':         # every key a pickled object that runs a command when loaded
        with open(path, 'wb') as f:
            numpy.savez(f, **{k: numpy.array(Payload(op[3]), dtype=object) for k in op[2]})
'''


def _npy(array):
    buf = io.BytesIO()
    numpy.save(buf, array)
    return buf.getvalue()


def _zip(path, entries):
    """Write a zip of ``entries`` ``(name, method, data, crc, declared size)`` by hand (sizes may lie)."""
    out, central = io.BytesIO(), []
    for name, method, data, crc, declared in entries:
        offset = out.tell()
        raw = name.encode()
        out.write(struct.pack('<4s5H3L2H', b'PK\x03\x04', 20, 0, method, 0, 0x21, crc, len(data),
                              declared, len(raw), 0) + raw + data)
        central.append(struct.pack('<4s6H3L5H2L', b'PK\x01\x02', 20, 20, 0, method, 0, 0x21, crc,
                                   len(data), declared, len(raw), 0, 0, 0, 0, 0, offset) + raw)
    start = out.tell()
    for c in central:
        out.write(c)
    out.write(struct.pack('<4s4H2LH', b'PK\x05\x06', 0, 0, len(entries), len(entries),
                          out.tell() - start, start, 0))
    with open(path, 'wb') as f:
        f.write(out.getvalue())


def _stored(name, array):
    data = _npy(array)
    return (name + '.npy', 0, data, zlib.crc32(data), len(data))


_BOMB = []


def _bomb_stream():
    """Return ``(deflate stream, inflated size, npy header)``: 3 GiB of float64 zeros in ~3 MB."""
    if not _BOMB:
        chunk, count = 16 << 20, 3 * GIB // (16 << 20)
        buf = io.BytesIO()
        numpy.lib.format.write_array_header_1_0(buf, {'descr': '<f8', 'fortran_order': False,
                                                      'shape': (count * chunk // 8,)})
        header = buf.getvalue()
        comp = zlib.compressobj(9, zlib.DEFLATED, -15)
        head = comp.compress(header) + comp.flush(zlib.Z_FULL_FLUSH)
        block = comp.compress(bytes(chunk)) + comp.flush(zlib.Z_FULL_FLUSH)
        # After a full flush the same input gives the same output: repeat the block.
        _BOMB.append((head + block * count + comp.flush(), len(header) + count * chunk, header))
    return _BOMB[0]


def _bomb(path, key, lie=None):
    """Write an npz whose member ``key`` inflates to 3 GiB; its entry declares ``lie`` bytes if given.

    A lying entry has the CRC of the bytes it declares, so that ``zipfile`` itself finds nothing
    wrong: the reader must compare the ``.npy`` header with the entry.
    """
    stream, size, header = _bomb_stream()
    entries = [_stored(k, numpy.full(s, 1.0, numpy.float32)) for k, s in SHAPES.items() if k != key]
    crc = 0 if lie is None else zlib.crc32(header + bytes(lie - len(header)))
    entries.append((key + '.npy', 8, stream, crc, size if lie is None else lie))
    _zip(path, entries)


def _meta(rank, iteration):
    return {'iteration': iteration, 'rank': rank, 'world_size': 2}


def _by_case(out):
    got = {}
    for r in (0, 1):
        if os.path.exists('{}.{}'.format(out, r)):
            with open('{}.{}'.format(out, r)) as f:
                for line in f:
                    doc = json.loads(line)
                    got.setdefault(doc['case'], {})[doc['rank']] = doc
    return got


def _refused_together(runs, cls, *words):
    """Assert both ranks ended the case with the same error class and message, naming ``words``."""
    assert sorted(runs) == [0, 1], runs
    for r, doc in runs.items():
        assert doc['error'] is not None and doc['error'][0] == cls, (r, doc)
        for w in words:
            assert w in doc['error'][1], (r, w, doc['error'][1])
    # One message on every rank (some name the rank that raises them first).
    texts = {re.sub(r'^rank \d+: ', '', runs[r]['error'][1]) for r in runs}
    assert len(texts) == 1, texts


def _own_regular(path):
    st = os.lstat(path)
    return stat.S_ISREG(st.st_mode) and st.st_uid == 0 and stat.S_IMODE(st.st_mode) & 0o022 == 0


def test_planted_files_against_a_root_job(base, shared_dir, as_nobody, secret):
    marker = os.path.join(base, 'code-ran')
    d = {n: shared_dir(n) for n in ('planted', 'links', 'owner_links', 'load_links', 'poison',
                                    'poison_only', 'poison_snap', 'poison_snap_untrusted', 'stray',
                                    'renamed', 'bomb_known', 'bomb_lying', 'bomb_sibling',
                                    'bomb_snap')}
    valid = {k: [list(s), 7.0] for k, s in SHAPES.items()}
    ops = []
    for r in (0, 1):
        ops += [['snapshot', os.path.join(d['planted'], 'run.{}.1000'.format(r)), valid, _meta(r, 20)],
                ['snapshot', os.path.join(d['renamed'], 'run.{}.1000'.format(r)), valid, _meta(r, 20)],
                ['symlink', os.path.join(d['links'], 'run.{}.5'.format(r)), secret],
                ['symlink', os.path.join(d['links'], '.run.{}.5.tmp'.format(r)), secret],
                ['symlink', os.path.join(d['owner_links'], '.run.{}.owner'.format(r)), secret],
                ['symlink', os.path.join(d['load_links'], 'run.{}.9'.format(r)), secret],
                ['poison', os.path.join(d['poison'], 'run.{}.7'.format(r)), list(SHAPES), marker],
                ['poison', os.path.join(d['poison_only'], 'run.{}.7'.format(r)), list(SHAPES), marker]]
    ops += [['poison', os.path.join(d[n], 'snapshot_iter_9.0'),
             ['updater/model:main/predictor/l1/W', 'updater/iteration'], marker]
            for n in ('poison_snap', 'poison_snap_untrusted')]
    ops += [['text', os.path.join(d['stray'], n), 'x'] for n in ('run.0.²', 'run.0.05', 'run.1.x')]
    bombs = os.path.join(base, 'bombs')
    os.mkdir(bombs)
    os.chmod(bombs, 0o755)
    for r in (0, 1):
        _bomb(os.path.join(bombs, 'known.{}'.format(r)), 'l1/W')
        _bomb(os.path.join(bombs, 'lying.{}'.format(r)), 'l1/W', lie=1024)
    _bomb(os.path.join(bombs, 'sibling.0'), 'junk')   # an outlier: its sibling below is small
    _bomb(os.path.join(bombs, 'snap'), 'updater/model:main/predictor/l1/W')
    for r in (0, 1):
        ops += [['copy', os.path.join(d['bomb_known'], 'run.{}.9'.format(r)),
                 os.path.join(bombs, 'known.{}'.format(r))],
                ['copy', os.path.join(d['bomb_lying'], 'run.{}.9'.format(r)),
                 os.path.join(bombs, 'lying.{}'.format(r))]]
    ops += [['copy', os.path.join(d['bomb_sibling'], 'run.0.9'), os.path.join(bombs, 'sibling.0')],
            ['snapshot', os.path.join(d['bomb_sibling'], 'run.1.9'), valid, _meta(1, 9)],
            ['copy', os.path.join(d['bomb_snap'], 'snapshot_iter_9.0'), os.path.join(bombs, 'snap')]]
    as_nobody(PLANT, json.dumps(ops))

    shared = {'allow_shared': True}
    cases = [
        ['planted', 'save_then_load', d['planted'], {}],
        ['links', 'save_then_load', d['links'], dict(shared, save=[5])],
        ['owner_links', 'save_then_load', d['owner_links'], dict(shared, save=[5])],
        ['load_links', 'save_then_load', d['load_links'], dict(shared, save=[5])],
        ['poison', 'save_then_load', d['poison'], dict(shared, save=[5])],
        ['poison_only', 'save_then_load', d['poison_only'], shared],
        ['poison_snap', 'snapshot_load', d['poison_snap'], {'trust': True}],
        ['poison_snap_untrusted', 'snapshot_load', d['poison_snap_untrusted'], {}],
        ['stray', 'save_then_load', d['stray'], dict(shared, save=[3, 4, 5], cp_interval=1,
                                                      gc_interval=1)],
        ['renamed', 'save_then_load', d['renamed'], dict(shared, save=[5])],
        ['swap', 'optimizer_swap', base, {}],
        ['bomb_known', 'save_then_load', d['bomb_known'], dict(shared, save=[5])],
        ['bomb_lying', 'save_then_load', d['bomb_lying'], dict(shared, save=[5])],
        ['bomb_sibling', 'save_then_load', d['bomb_sibling'], dict(shared, save=[5])],
        ['bomb_snap', 'snapshot_load', d['bomb_snap'], {'trust': True}],
    ]
    spec = os.path.join(base, 'cases.json')
    with open(spec, 'w') as f:
        json.dump(cases, f)
    out = os.path.join(base, 'results')
    res = run_mpi([JOB, spec, out], 2, timeout=240, env={'CHAINERMN_TRUST_SHARED': ''})
    report = 'exit {}\n--- stdout ---\n{}\n--- stderr ---\n{}'.format(res.returncode, res.stdout[-4000:],
                                                                     res.stderr[-6000:])
    assert res.returncode == 0 and not res.timed_out, report
    got = _by_case(out)
    assert sorted(got) == sorted(c[0] for c in cases), report

    # Nothing of the job ever reached the secret, and no payload ran.
    with open(secret, 'rb') as f:
        assert f.read() == b'root only'
    assert stat.S_IMODE(os.stat(secret).st_mode) == 0o600 and os.stat(secret).st_uid == 0
    assert not os.path.exists(marker)

    # A generation planted in a 1777 directory: refused at start, with the fix; nothing removed.
    _refused_together(got['planted'], 'UntrustedPathError', 'rank 0:', d['planted'], 'mode 1777',
                      'other users can write it', 'mkdir -m 700', 'CHAINERMN_TRUST_SHARED=1')
    assert sorted(os.listdir(d['planted'])) == ['run.0.1000', 'run.1.1000']

    # Symlinks at the final and temporary names: replaced, never followed.
    for r in (0, 1):
        assert got['links'][r]['error'] is None and got['links'][r]['result']['loaded'] == 5
        assert got['links'][r]['result']['w'] == 5 + r
        assert _own_regular(os.path.join(d['links'], 'run.{}.5'.format(r)))
    # ... at the owner records: refused (a link is never read or written through).
    _refused_together(got['owner_links'], 'UntrustedPathError', 'symbolic link', '.owner')
    # ... at a newer generation: refused, nothing loaded.
    _refused_together(got['load_links'], 'UntrustedPathError', 'symbolic link', 'run.0.9')

    # Poisoned npz: refused before any unpickling (the marker above); an older own generation loads.
    for r in (0, 1):
        assert got['poison'][r]['result']['loaded'] == 5, got['poison'][r]
    assert any('needs pickle' in w for w in got['poison'][0]['warnings']), got['poison'][0]
    _refused_together(got['poison_only'], 'UnsafeCheckpointError', 'needs pickle', 'nothing was loaded')
    _refused_together(got['poison_snap'], 'UnsafeCheckpointError', 'snapshot_iter_9.0', 'needs pickle')
    _refused_together(got['poison_snap_untrusted'], 'UntrustedPathError', d['poison_snap_untrusted'],
                      'mode 1777')

    # Stray names: ignored with one warning (on one rank of the node), never loaded or removed.
    for r in (0, 1):
        assert got['stray'][r]['error'] is None and got['stray'][r]['result']['loaded'] == 5
    stray_warnings = [w for r in (0, 1) for w in got['stray'][r]['warnings'] if 'ASCII digits' in w]
    assert len(stray_warnings) == 1 and "'run.0.²'" in stray_warnings[0], stray_warnings
    assert {'run.0.²', 'run.0.05', 'run.1.x'} <= set(os.listdir(d['stray']))

    # A generation whose files say another iteration than their names: refused, named.
    for r in (0, 1):
        assert got['renamed'][r]['result']['loaded'] == 5 and got['renamed'][r]['result']['w'] == 5 + r
    assert any('records iteration 20 but its name says 1000' in w
               for w in got['renamed'][0]['warnings']), got['renamed'][0]

    # Adam -> MomentumSGD: refused naming both classes; the weights alone on request.
    for r in (0, 1):
        swap = got['swap'][r]['result']
        assert swap['refused'][0] == 'SnapshotUnusableError', swap
        assert 'chainer.optimizers.adam.Adam' in swap['refused'][1], swap
        assert 'chainer.optimizers.momentum_sgd.MomentumSGD' in swap['refused'][1], swap
        assert 'weights_only=True' in swap['refused'][1], swap
        assert swap['unchanged_after_refusal'] is True
        assert swap['weights_only'] == 2 and swap['weights_equal'] is True
        assert swap['iteration'] == 0 and swap['momentum_state'] is False

    # Compression bombs: refused before inflating (3 GiB never allocated), older generation loads.
    for case, words in (('bomb_known', "member 'l1/W' declares"), ('bomb_lying', 'says it holds'),
                        ('bomb_sibling', 'far more than')):
        for r in (0, 1):
            assert got[case][r]['error'] is None and got[case][r]['result']['loaded'] == 5, got[case][r]
        assert any(words in w for w in got[case][0]['warnings']), (case, got[case][0]['warnings'])
    _refused_together(got['bomb_snap'], 'SnapshotUnusableError', 'declares', 'snapshot_iter_9.0')
    for r in (0, 1):
        assert got['bomb_snap'][r]['maxrss_kib'] < 1024 * 1024, got['bomb_snap'][r]   # < 1 GiB
    # The payload was live all along: unpickling the planted file runs it.
    with numpy.load(os.path.join(d['poison_only'], 'run.0.7'), allow_pickle=True) as npz:
        npz['l1/W']
    assert os.path.exists(marker)
