"""docs/converting.md: every script on the page, verbatim, at 3 ranks in one mpiexec launch.

Each block is written to its own file and run with ``runpy`` in its own empty folder, one after the
other in the same 3 processes (one launch instead of one per block); the test then checks what each printed.
"""

import os
import re
import textwrap

from chainermn_comm.testing import run_mpi

from docs_support import block

RANKS = 3
NAMES = ('converting-scatter', 'converting-share', 'converting-weights', 'converting-updaters',
         'converting-batchsize', 'converting-reports', 'converting-seeds', 'converting-evaluator',
         'converting-resume', 'converting-device', 'converting-saving')

DRIVER = textwrap.dedent('''
    import os, runpy, sys
    from mpi4py import MPI
    here = os.getcwd()
    for path in sys.argv[1:]:
        name = os.path.splitext(os.path.basename(path))[0]
        os.chdir(os.path.join(here, name))
        MPI.COMM_WORLD.Barrier()   # one block at a time on every rank
        runpy.run_path(path, run_name='__main__')
        os.chdir(here)
    print('rank {}: every block ran'.format(MPI.COMM_WORLD.Get_rank()))
''')


def _blocks():
    # The literal block('NAME') calls tell tests/test_runnable_docs.py which blocks this file runs.
    return {
        'converting-scatter': block('converting-scatter'),
        'converting-share': block('converting-share'),
        'converting-weights': block('converting-weights'),
        'converting-updaters': block('converting-updaters'),
        'converting-batchsize': block('converting-batchsize'),
        'converting-reports': block('converting-reports'),
        'converting-seeds': block('converting-seeds'),
        'converting-evaluator': block('converting-evaluator'),
        'converting-resume': block('converting-resume'),
        'converting-device': block('converting-device'),
        'converting-saving': block('converting-saving'),
    }


def _floats(pattern, text):
    return [float(v) for v in re.findall(pattern, text)]


def test_converting_page_scripts_at_3_ranks(tmp_path):
    blocks = _blocks()
    assert tuple(blocks) == NAMES
    paths = []
    for name, b in blocks.items():
        assert b.lang == 'python', (name, b.lang)
        (tmp_path / name).mkdir()
        path = tmp_path / (name + '.py')
        path.write_text(b.text)
        paths.append(str(path))
    (tmp_path / 'driver.py').write_text(DRIVER)
    res = run_mpi([str(tmp_path / 'driver.py')] + paths, RANKS, timeout=240, cwd=str(tmp_path),
                  env={'MPLBACKEND': 'Agg'})
    out = res.stdout
    report = 'status {} after {:.0f}s{}\n--- stdout ---\n{}\n--- stderr ---\n{}'.format(
        res.returncode, res.seconds, ' (TIMED OUT)' if res.timed_out else '', out[-6000:], res.stderr[-6000:])
    assert not res.timed_out and res.returncode == 0, report
    assert sorted(re.findall(r'rank (\d): every block ran', out)) == ['0', '1', '2'], report

    # scatter_dataset: consecutive blocks; training shards padded by wrapping, test shards not.
    shards = dict((int(r), (tr, te)) for r, tr, te in
                  re.findall(r'rank (\d): train (\[[\d, ]*\]) test (\[[\d, ]*\])', out))
    assert shards == {0: ('[0, 1, 2, 3]', '[0, 1, 2, 3]'), 1: ('[4, 5, 6, 7]', '[4, 5, 6]'),
                      2: ('[7, 8, 9, 0]', '[7, 8, 9]')}, report
    # bcast_obj: rank 0's value everywhere; the words in order.
    shared = dict((int(r), (v, w)) for r, v, w in
                  re.findall(r'rank (\d): n_vocab (\d+) words (\[[\d, ]*\])', out))
    assert shared == {0: ('10', '[3, 1, 4, 1]'), 1: ('10', '[5, 9, 2, 6]'), 2: ('10', '[5, 3, 5, 3]')}, report
    # Initial weights.
    assert out.count('same weights: before setup False, after setup True') == 1, report
    assert out.count('lazy link: same weights True, updates 0') == 1, report
    # Custom updater, hook, eval_hook, evaluator called by hand.
    assert out.count('updates: 3, the same weights on every rank: True') == 1, report
    assert len(re.findall(r'eval_hook calls: 1, validation loss', out)) == 1, report
    validation = _floats(r'validation loss: ([0-9.]+)', out)
    whole = _floats(r'loss on the whole test set: ([0-9.]+)', out)
    assert len(validation) == len(whole) == 1 and abs(validation[0] - whole[0]) < 2e-6, report
    # Batch size: per rank; the update is one process's with the global batch.
    assert out.count('3 ranks x batchsize 4: the update of one process with a batch of 12: True') == 1, report
    # Reports: rank 0's own value, and the aggregated mean over ranks, each equal to what it claims.
    reports = re.findall(r"main/loss ([0-9.]+) is rank 0's own \(([0-9.]+)\); main/loss_all ([0-9.]+) is "
                         r"the mean over ranks \(([0-9.]+)\)", out)
    assert len(reports) == 1, report
    own, own_check, mean, mean_check = (float(v) for v in reports[0])
    assert own == own_check and mean == mean_check and abs(own - mean) > 1e-3, report
    # Seeds: per-rank randomness, rank 0's weights everywhere.
    assert out.count('dropout masks differ between ranks: True; weights equal after setup: True') == 1, report
    # The evaluator: the mean of the batches' values; a (value, weight) report: of the examples.
    assert out.count('batch_mean 33.5000, the mean of the 6 batch means 33.5000') == 1, report
    assert out.count('example_mean 28.5000, the mean of the 10 examples 28.5000') == 1, report
    # A resume: the iterator's own saved RNG repeats the run without a break; numpy.random does not.
    assert out.count('global RNG: after the resume, the rest of epoch 2 as without a break: True, '
                     'epoch 3: False') == 1, report
    assert out.count('serialized RNG: after the resume, the rest of epoch 2 as without a break: True, '
                     'epoch 3: True') == 1, report
    # No rank fed the same batches as another (the docs' scripts make no mistake on purpose).
    assert 'IdenticalBatchesWarning' not in res.stdout + res.stderr, report
    # Devices: a GPU spec becomes GPU intra_rank; the CPU stays.
    for r in range(RANKS):
        assert 'rank {}: --device 0 -> @cupy:{}'.format(r, r) in out, report
        assert 'rank {}: --device @cupy:0 -> @cupy:{}'.format(r, r) in out, report
        assert 'rank {}: --device -1 -> -1'.format(r) in out, report
        assert 'rank {}: model on @numpy'.format(r) in out, report
    # Saving: rank 0 only, into its own folder.
    assert out.count("rank 0 wrote ['model.npz', 'reconstructed.png']") == 1, report
    assert sorted(os.listdir(str(tmp_path / 'converting-saving' / 'result'))) == [
        'model.npz', 'reconstructed.png'], report
