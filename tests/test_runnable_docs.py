"""The docs stay true: their runnable blocks are run by tests, and no file holds a merge conflict.

A runnable block is a fenced block right after ``<!-- runnable: NAME -->`` in README.md or
docs/*.md (``docs_support``). Each NAME is run, verbatim, by the test listed in ``RUN_BY``; a block
that no test runs fails here. This module runs the short ones itself (``demo``).
"""

import os
import re
import subprocess

import pytest

from docs_support import DOC_FILES, ROOT, block, run_in_session, runnable_blocks

#: Which test runs each runnable block (it reads the block with ``docs_support.block(NAME)``).
RUN_BY = {
    'install': 'tests/test_readme_install.py',
    'quickstart': 'tests/test_quickstart.py',
    'demo': 'tests/test_runnable_docs.py',
    'hook': 'tests/test_hooks_docs.py',
    'converting-scatter': 'tests/test_converting_docs.py',
    'converting-share': 'tests/test_converting_docs.py',
    'converting-weights': 'tests/test_converting_docs.py',
    'converting-updaters': 'tests/test_converting_docs.py',
    'converting-batchsize': 'tests/test_converting_docs.py',
    'converting-reports': 'tests/test_converting_docs.py',
    'converting-seeds': 'tests/test_converting_docs.py',
    'converting-evaluator': 'tests/test_converting_docs.py',
    'converting-resume': 'tests/test_converting_docs.py',
    'converting-device': 'tests/test_converting_docs.py',
    'converting-saving': 'tests/test_converting_docs.py',
}


def test_every_runnable_block_is_run_by_a_test():
    blocks = runnable_blocks()
    names = [b.name for b in blocks]
    assert len(names) == len(set(names)), 'runnable block names must be unique: {}'.format(names)
    for b in blocks:
        where = '{}:{}'.format(os.path.relpath(b.path, ROOT), b.line)
        assert b.name in RUN_BY, ('{}: no test runs the block <!-- runnable: {} -->; add one and list it '
                                  'in RUN_BY'.format(where, b.name))
        assert b.lang in ('bash', 'sh', 'python'), (where, b.lang)
        with open(os.path.join(ROOT, RUN_BY[b.name])) as f:
            assert "block('{}')".format(b.name) in f.read(), (where, RUN_BY[b.name])
    assert {'install', 'quickstart', 'demo'} <= set(names), names  # issue 32: at least these


def test_docs_name_no_path_of_one_machine():
    for path in DOC_FILES:
        with open(path, encoding='utf-8') as f:
            for number, line in enumerate(f, 1):
                assert not re.search(r'(?<![\w.])/(work|root|home/\w+)/', line), (
                    '{}:{}: a path of one machine: {}'.format(os.path.relpath(path, ROOT), number,
                                                              line.strip()))


def readme_made_paths(text):
    """Return the paths the README's commands make in the current directory (files; folders end in /)."""
    made = set(re.findall(r'python -m venv (\w[\w.-]*)', text))
    made = {m + '/' for m in made}
    made |= {m + '/' for m in re.findall(r'pip wheel [^\n`]*-w (\w[\w.-]*)', text)}
    made |= set(re.findall(r'> (\w[\w.-]*\.\w+)', text))
    return made


def test_readme_made_paths_are_found():
    text = ('`python -m venv venv && .`\necho "x" > build-constraints.txt\n'
            'pip wheel --no-deps -w wheels packages/*\n')
    assert readme_made_paths(text) == {'venv/', 'wheels/', 'build-constraints.txt'}


def test_files_the_readme_makes_are_ignored_in_a_checkout():
    # Issue 44: the README's own commands, run in the repository root, leave no untracked files.
    with open(os.path.join(ROOT, 'README.md'), encoding='utf-8') as f:
        made = readme_made_paths(f.read())
    assert {'venv/', 'wheels/', 'build-constraints.txt'} <= made, made
    made |= {'result/'}  # the Quick start's --out
    try:
        res = subprocess.run(['git', 'check-ignore', '--no-index', '--stdin'], cwd=ROOT, text=True,
                             input='\n'.join(sorted(made)) + '\n', capture_output=True, timeout=60)
    except OSError:
        pytest.skip('git is not installed')
    if res.returncode not in (0, 1):
        pytest.skip('not a git checkout: ' + res.stderr.strip())
    ignored = set(res.stdout.split())
    assert ignored == made, 'add to .gitignore: {}'.format(sorted(made - ignored))

def _tracked_files():
    try:
        res = subprocess.run(['git', 'ls-files', '-z'], cwd=ROOT, capture_output=True, timeout=60)
    except OSError:
        pytest.skip('git is not installed')
    if res.returncode != 0:
        pytest.skip('not a git checkout: ' + res.stderr.decode(errors='replace').strip())
    return [p for p in res.stdout.decode().split('\0') if p]


def conflict_markers(text):
    """Return the 1-based line numbers of merge-conflict markers in ``text``."""
    found = []
    inside = False
    for number, line in enumerate(text.split('\n'), 1):
        if line.startswith('<<<<<<< ') or line == '<<<<<<<':
            inside = True
            found.append(number)
        elif inside and (line == '=======' or line.startswith('||||||| ')):
            found.append(number)
        elif line.startswith('>>>>>>> ') or line == '>>>>>>>':
            inside = False
            found.append(number)
    return found


def test_conflict_markers_are_found():
    text = 'a\n<<<<<<< HEAD\nb\n=======\nc\n>>>>>>> branch\nTitle\n=======\n'
    assert conflict_markers(text) == [2, 4, 6]


def test_no_merge_conflict_markers_in_tracked_files():
    bad = []
    for rel in _tracked_files():
        path = os.path.join(ROOT, rel)
        if not os.path.isfile(path) or os.path.islink(path):
            continue
        with open(path, 'rb') as f:
            data = f.read()
        if b'\0' in data[:8192]:
            continue  # binary
        lines = conflict_markers(data.decode('utf-8', errors='replace'))
        if lines:
            bad.append('{}: lines {}'.format(rel, ', '.join(map(str, lines))))
    assert not bad, 'merge-conflict markers left in tracked files:\n' + '\n'.join(bad)


@pytest.mark.slow
def test_demo_block_trains_to_90_percent():
    if not os.path.isfile(os.path.join(ROOT, '.venv', '.chainermn-bootstrap')):
        pytest.skip('no bootstrapped .venv in the checkout: the demo would create one '
                    '(run `bash scripts/bootstrap.sh` first)')
    if not os.path.exists(os.path.realpath(os.path.join(ROOT, '.venv', 'bin', 'python'))):
        # E.g. the Python 3.14 chroot sees the host's .venv, whose interpreter lives outside it;
        # the demo would try to rebuild that venv.  The README set-up proves the demo.
        pytest.skip('the .venv in the checkout was made with an interpreter that is not here')
    demo = block('demo')
    env = {k: v for k, v in os.environ.items() if k not in ('VIRTUAL_ENV', 'PYTHONPATH')}
    env.update(PYTHONUNBUFFERED='1', CHAINERMN_TIMEOUT='300')
    res = run_in_session(['bash', '-e', '-c', demo.text], timeout=600, cwd=ROOT, env=env)
    report = 'status {} after {:.0f}s{}\n--- stdout ---\n{}\n--- stderr ---\n{}'.format(
        res.returncode, res.seconds, ' (TIMED OUT)' if res.timed_out else '', res.stdout[-6000:],
        res.stderr[-6000:])
    assert not res.timed_out and res.returncode == 0, report
    found = re.findall(r'^(?:\x1b\[\d*[AJ])*FINAL validation/main/accuracy=([0-9.]+) .* ranks=2 ', res.stdout, re.M)
    assert len(found) == 1 and float(found[0]) > 0.9, report
