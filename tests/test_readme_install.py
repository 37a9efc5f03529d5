"""The README's install block, verbatim, in a fresh venv against the wheels built from the checkout.

The project is not on PyPI yet, so the wheels of every package under ``packages/`` are built into a
folder that pip is pointed at with ``PIP_FIND_LINKS``, as the README tells users to do. The block
then runs unchanged with bash in an empty directory, in a fresh ``python -m venv`` that is activated
first, with the checkout nowhere on ``sys.path``. Then ``import chainermn`` must be ours and the
README's Quick start must train on 2 ranks under the venv's ``mpiexec`` and draw ``result/loss.png``.
"""

import glob
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from docs_support import ROOT, block, run_in_session

pytestmark = pytest.mark.slow

FINAL = re.compile(r'^(?:\x1b\[\d*[AJ])*FINAL iteration=(\d+) validation/main/accuracy=([0-9.]+)$', re.M)


def _clean_env(**extra):
    """This environment without anything that would reach the checkout's venv or sources."""
    env = {k: v for k, v in os.environ.items()
           if k not in ('PYTHONPATH', 'PYTHONHOME', 'VIRTUAL_ENV', 'PYTHONSTARTUP', 'PIP_FIND_LINKS')}
    dev_bin = os.path.dirname(sys.executable)
    env['PATH'] = os.pathsep.join(p for p in env.get('PATH', '').split(os.pathsep)
                                  if p and os.path.realpath(p) != os.path.realpath(dev_bin))
    env.update(extra)
    return env


def _check(res, what):
    report = '{}: status {} after {:.0f}s{}\n--- stdout ---\n{}\n--- stderr ---\n{}'.format(
        what, res.returncode, res.seconds, ' (TIMED OUT)' if res.timed_out else '',
        res.stdout[-8000:], res.stderr[-8000:])
    assert not res.timed_out and res.returncode == 0, report
    return report


def build_all_wheels(out):
    """Build one wheel per package under packages/ into ``out``; return their file names."""
    packages = sorted(p for p in glob.glob(os.path.join(ROOT, 'packages', '*'))
                      if os.path.isfile(os.path.join(p, 'pyproject.toml')))
    res = subprocess.run([sys.executable, '-m', 'pip', 'wheel', '-q', '--no-deps',
                          '--no-build-isolation', '-w', str(out)] + packages,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    wheels = sorted(os.path.basename(w) for w in glob.glob(os.path.join(str(out), '*.whl')))
    assert len(wheels) == len(packages), (wheels, packages)
    return wheels


PROBE = textwrap.dedent('''
    import json, os, sys, sysconfig
    import chainermn, chainer, numpy
    print('PROBE ' + json.dumps({
        'file': os.path.realpath(chainermn.__file__),
        'site': os.path.realpath(sysconfig.get_paths()['purelib']),
        'create_communicator': chainermn.create_communicator.__module__,
        'sys_path': [os.path.realpath(p) for p in sys.path if p],
        'chainer': chainer.__version__, 'numpy': numpy.__version__}))
''')


def test_readme_install_block_in_a_fresh_venv(tmp_path):
    wheels = tmp_path / 'wheels'
    built = build_all_wheels(wheels)
    for name in built:  # dependencies are version ranges, never paths of this machine
        out = subprocess.run([sys.executable, '-c', (
            'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); '
            'print(z.read([n for n in z.namelist() if n.endswith(".dist-info/METADATA")][0]).decode())'),
            str(wheels / name)], capture_output=True, text=True, check=True).stdout
        requires = [ln for ln in out.splitlines() if ln.startswith('Requires-Dist:')]
        assert not [r for r in requires if 'file:' in r or '@' in r], (name, requires)

    install = block('install')
    assert install.lang == 'bash', install
    user = tmp_path / 'user'
    user.mkdir()
    script = user / 'install.sh'
    script.write_text('set -e -o pipefail\n. venv/bin/activate\n' + install.text)
    env = _clean_env(PIP_FIND_LINKS=str(wheels), PYTHONNOUSERSITE='1')
    res = subprocess.run([sys.executable, '-m', 'venv', str(user / 'venv')], capture_output=True,
                         text=True, timeout=300, env=env, cwd=str(user))
    assert res.returncode == 0, res.stderr
    res = run_in_session(['bash', str(script)], timeout=1200, cwd=str(user), env=env)
    _check(res, 'the README install block')

    python = user / 'venv' / 'bin' / 'python'
    res = run_in_session([python, '-c', PROBE], timeout=300, cwd=str(user), env=env)
    report = _check(res, 'import chainermn')
    got = json.loads(next(ln for ln in res.stdout.splitlines() if ln.startswith('PROBE '))[6:])
    # Ours (the meta-package's directory in the venv), not Chainer's bundled chainermn.
    assert got['file'] == os.path.join(got['site'], '_chainermn_meta', 'chainermn', '__init__.py'), report
    assert got['create_communicator'].startswith('chainermn_comm'), report
    assert not any(p == ROOT or p.startswith(ROOT + os.sep) for p in got['sys_path']), report
    assert got['chainer'] == '7.8.1', report

    # The README's Quick start, as a user runs it in that venv: 2 ranks under the venv's mpiexec.
    (user / 'train.py').write_text(block('quickstart').text)
    res = run_in_session([user / 'venv' / 'bin' / 'mpiexec', '-n', '2', python, 'train.py'],
                         timeout=900, cwd=str(user),
                         env=dict(env, PYTHONUNBUFFERED='1', CHAINERMN_TIMEOUT='300'))
    report = _check(res, 'mpiexec -n 2 python train.py')
    final = FINAL.findall(res.stdout)
    assert len(final) == 1, report  # printed by rank 0 only
    iteration, accuracy = int(final[0][0]), float(final[0][1])
    assert iteration == 75, report  # 10 epochs of 750 samples per rank in batches of 100
    assert accuracy > 0.9, report
    # The install block installs what the Quick start uses: PlotReport draws (issue 44).
    assert 'matplotlib is not installed' not in res.stderr, report
    assert (user / 'result' / 'loss.png').is_file(), report
