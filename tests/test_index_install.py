"""``pip install chainermn`` as users will run it once the packages are published.

Our six wheels are served from a PEP 503 simple index on 127.0.0.1 (``http.server`` over a
folder), added to the real registry with ``--extra-index-url``.  The registry holds the original
``chainermn`` 1.3.1, so the tests also prove that plain ``pip install chainermn`` picks ours.
Fresh venvs are made without pip (this venv's pip drives them with ``--python``: same cache,
no ensurepip); Chainer's sdist is built once into pip's wheel cache (see ``chainer_cached``).
"""

import functools
import hashlib
import html
import http.server
import json
import os
import re
import sys
import textwrap
import threading

import pytest

from packaging_support import PACKAGES, build_wheels, new_bare_venv, repo_version, run

pytestmark = pytest.mark.slow


def _normalize(name):
    return re.sub(r'[-_.]+', '-', name).lower()


def write_simple_index(root, wheels):
    """Write a PEP 503 index of ``wheels`` under ``root``: simple/<project>/index.html, files/."""
    files = os.path.join(root, 'files')
    os.makedirs(files)
    projects = {}
    for wheel in wheels:
        name = os.path.basename(wheel)
        with open(wheel, 'rb') as src:
            data = src.read()
        with open(os.path.join(files, name), 'wb') as dst:
            dst.write(data)
        digest = hashlib.sha256(data).hexdigest()
        projects.setdefault(_normalize(name.split('-')[0]), []).append((name, digest))
    page = '<!DOCTYPE html>\n<html><body>\n{}</body></html>\n'
    links = ''.join('<a href="{0}/">{0}</a>\n'.format(p) for p in sorted(projects))
    os.makedirs(os.path.join(root, 'simple'))
    with open(os.path.join(root, 'simple', 'index.html'), 'w') as f:
        f.write(page.format(links))
    for project, entries in projects.items():
        os.makedirs(os.path.join(root, 'simple', project))
        links = ''.join('<a href="../../files/{0}#sha256={1}">{0}</a>\n'.format(html.escape(n), d)
                        for n, d in entries)
        with open(os.path.join(root, 'simple', project, 'index.html'), 'w') as f:
            f.write(page.format(links))


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


@pytest.fixture(scope='module')
def index_url(tmp_path_factory):
    """URL of a simple index on 127.0.0.1 that serves our six wheels (for this module's tests)."""
    wheels = build_wheels(str(tmp_path_factory.mktemp('wheels')))
    root = str(tmp_path_factory.mktemp('index'))
    write_simple_index(root, wheels)
    handler = functools.partial(_QuietHandler, directory=root)
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield 'http://127.0.0.1:{}/simple/'.format(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope='module')
def chainer_cached(index_url, tmp_path_factory):
    """Put a wheel of Chainer 7.8.1 into pip's cache, built from the sdist the registry serves.

    The sdist's setup.py imports pkg_resources, which setuptools 81+ lacks, so it builds only with
    ``setuptools<81`` (README: ``--build-constraint``).  pip caches the built wheel under the
    sdist's URL, so the plain ``pip install`` calls below find it; this is instant once cached.
    """
    tmp = tmp_path_factory.mktemp('chainer')
    constraint = tmp / 'build-constraint.txt'
    constraint.write_text('setuptools<81\n')
    run([sys.executable, '-m', 'pip', 'wheel', '-q', '--no-deps', '--build-constraint', constraint,
         '--extra-index-url', index_url, '-w', tmp, 'chainer==7.8.1'])


def _pip_install(pip, index_url, *args, report=None):
    cmd = pip + ['install', '-q', '--disable-pip-version-check', '--extra-index-url', index_url]
    if report is not None:
        cmd += ['--report', report]
    return run(cmd + list(args))


def _planned(report):
    with open(str(report)) as f:
        return {i['metadata']['name']: (i['metadata']['version'], i['download_info']['url'])
                for i in json.load(f)['install']}


PROBE = textwrap.dedent('''
    import importlib.metadata as md, json, os, sys, sysconfig
    import chainermn
    import chainer, numpy
    import chainer.functions as F
    x = numpy.arange(6, dtype=numpy.float32)
    y = F.as_strided(x, (2, 2), (2, 1))
    installed = {}
    for name in %r:
        try:
            installed[name] = md.version(name)
        except md.PackageNotFoundError:
            installed[name] = None
    print('PROBE ' + json.dumps({
        'file': os.path.realpath(chainermn.__file__),
        'site': os.path.realpath(sysconfig.get_paths()['purelib']),
        'version': chainermn.__version__,
        'finder_first': type(sys.meta_path[0]).__name__,
        'numpy': numpy.__version__, 'chainer': chainer.__version__,
        'as_strided': y.array.tolist(), 'installed': installed,
    }))
''') % (PACKAGES,)


def _probe(python, cwd):
    res = run([python, '-c', PROBE], cwd=str(cwd), timeout=300)
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith('PROBE '))
    return json.loads(line[len('PROBE '):])


def test_index_serves_ours_next_to_the_registrys_1_3_1(index_url):
    res = run([sys.executable, '-m', 'pip', 'index', 'versions', '--extra-index-url', index_url,
               'chainermn'])
    versions = re.search(r'Available versions: (.*)', res.stdout).group(1).split(', ')
    assert versions[0] == repo_version('chainermn'), versions  # ours is the newest...
    assert '1.3.1' in versions, versions  # ...and the original is on offer too


def test_plain_pip_install_chainermn_installs_ours(index_url, chainer_cached, tmp_path):
    python, pip = new_bare_venv(tmp_path / 'venv')
    report = tmp_path / 'report.json'
    _pip_install(pip, index_url, 'chainermn', report=report)
    planned = _planned(report)
    for name in PACKAGES:  # all six, at the repository's versions, from our index
        version, url = planned[name]
        assert version == repo_version(name), (name, planned[name])
        assert url.startswith(index_url.replace('/simple/', '/files/')), (name, url)
    assert planned['chainer'][0] == '7.8.1', planned['chainer']
    got = _probe(python, tmp_path)
    assert got['file'] == os.path.join(got['site'], '_chainermn_meta', 'chainermn', '__init__.py'), got
    assert got['version'] == repo_version('chainermn'), got
    assert got['installed'] == {name: repo_version(name) for name in PACKAGES}, got
    # Nothing pins NumPy below 2 any more: a fresh install gets NumPy 2, and Chainer runs on it.
    assert int(got['numpy'].split('.')[0]) >= 2, got
    assert got['as_strided'] == [[0.0, 1.0], [2.0, 3.0]], got
    run(pip + ['check'])


COMM = textwrap.dedent('''
    import importlib.metadata as md, json
    import chainermn_comm
    comm = chainermn_comm.create_communicator('naive')
    total = comm.allreduce_obj(comm.rank + 1)
    others = []
    for name in %r:
        try:
            md.version(name)
            others.append(name)
        except md.PackageNotFoundError:
            pass
    mine = {'rank': comm.rank, 'size': comm.size, 'total': total, 'others': others}
    everyone = comm.gather_obj(mine)  # one line from rank 0: ranks' lines may interleave
    if comm.rank == 0:
        for entry in everyone:
            print('COMM ' + json.dumps(entry), flush=True)
''') % (PACKAGES[1:],)


def test_chainermn_comm_alone_gives_a_working_communicator(index_url, chainer_cached, tmp_path):
    python, pip = new_bare_venv(tmp_path / 'venv')
    _pip_install(pip, index_url, 'mpich')  # the user's MPI (on a cluster: mpi4py built against it)
    _pip_install(pip, index_url, 'chainermn-comm')
    script = tmp_path / 'comm.py'
    script.write_text(COMM)
    mpiexec = os.path.join(os.path.dirname(python), 'mpiexec')
    res = run([mpiexec, '-n', '2', python, script], timeout=300, cwd=str(tmp_path))
    got = sorted((json.loads(ln[len('COMM '):]) for ln in res.stdout.splitlines()
                  if ln.startswith('COMM ')), key=lambda g: g['rank'])
    assert [(g['rank'], g['size'], g['total']) for g in got] == [(0, 2, 3), (1, 2, 3)], res.stdout
    assert got[0]['others'] == [], got  # no sibling came along
