"""One job per module: no source module of a package is longer than about 450 lines."""

import glob
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_LINES = 450
PACKAGES = sorted(os.path.dirname(p) for p in glob.glob(os.path.join(ROOT, 'packages', '*', 'src')))


@pytest.mark.parametrize('pkg', PACKAGES, ids=os.path.basename)
def test_no_source_module_over_450_lines(pkg):
    long = []
    for path in sorted(glob.glob(os.path.join(pkg, 'src', '**', '*.py'), recursive=True)):
        with open(path, encoding='utf-8') as f:
            n = sum(1 for _ in f)
        if n > MAX_LINES:
            long.append('{}: {} lines'.format(os.path.relpath(path, ROOT), n))
    assert not long, ('modules over {} lines; split them along their jobs:\n{}'.format(
        MAX_LINES, '\n'.join(long)))
