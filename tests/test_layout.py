"""The tree is what docs/layout.md says: standard backend, no benchmark in src/, testpaths that exist, tools on top."""

import ast
import glob
import os
import re

import pytest

tomllib = pytest.importorskip('tomllib')

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = sorted(os.path.basename(os.path.dirname(p))
                  for p in glob.glob(os.path.join(ROOT, 'packages', '*', 'pyproject.toml')))
LIBRARIES = ['chainermn-comm', 'chainermn-data', 'chainermn-links', 'chainermn-train']


def _toml(path):
    with open(path, 'rb') as f:
        return tomllib.load(f)


def _sources(package):
    return sorted(glob.glob(os.path.join(ROOT, 'packages', package, 'src', '**', '*.py'), recursive=True))


def _imported_top_names(path):
    """Top-level module names that ``import`` statements of ``path`` name (absolute imports only)."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split('.')[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split('.')[0])
    return names


def test_the_six_packages():
    assert PACKAGES == ['chainermn', 'chainermn-comm', 'chainermn-data', 'chainermn-links',
                        'chainermn-tools', 'chainermn-train'], PACKAGES


@pytest.mark.parametrize('package', PACKAGES)
def test_every_package_builds_with_poetry_core_and_no_custom_build_code(package):
    here = os.path.join(ROOT, 'packages', package)
    system = _toml(os.path.join(here, 'pyproject.toml'))['build-system']
    assert system['build-backend'] == 'poetry.core.masonry.api', (package, system)
    assert 'backend-path' not in system, (package, system)
    assert all(r.startswith('poetry-core') for r in system['requires']), (package, system)
    for name in ('setup.py', 'setup.cfg', 'build.py', '_build'):
        assert not os.path.exists(os.path.join(here, name)), (package, name)


@pytest.mark.parametrize('package', PACKAGES)
def test_no_benchmark_code_in_a_package(package):
    """Benchmarks live in bench/: none in a package's src/, and no loose script at a package's root."""
    here = os.path.join(ROOT, 'packages', package)
    for path in _sources(package):
        name = os.path.basename(path)
        assert not re.match(r'(bench|benchmark)', name) and not re.search(r'_bench(mark)?\.py$', name), path
        with open(path) as f:
            head = f.read(400).lower()
        assert not re.match(r'\s*(""")?\s*benchmark', head), path
    loose = [n for n in os.listdir(here) if n.endswith('.py')]
    assert loose == [], (package, loose)


def test_root_testpaths_list_exactly_the_test_folders_that_exist():
    paths = _toml(os.path.join(ROOT, 'pyproject.toml'))['tool']['pytest']['ini_options']['testpaths']
    missing = [p for p in paths if not os.path.isdir(os.path.join(ROOT, p))]
    assert missing == [], missing
    folders = ['packages/{}/tests'.format(p) for p in PACKAGES
               if os.path.isdir(os.path.join(ROOT, 'packages', p, 'tests'))]
    assert sorted(set(paths) - {'tests'}) == sorted(folders), paths
    assert 'tests' in paths


def test_no_library_imports_the_tools_and_the_tools_never_import_the_meta_package():
    for package in LIBRARIES:
        for path in _sources(package):
            assert 'chainermn_tools' not in _imported_top_names(path), path
    for path in _sources('chainermn-tools'):
        assert 'chainermn' not in _imported_top_names(path), path


def test_no_dependency_circle_between_distributions():
    deps = {}
    for package in PACKAGES:
        project = _toml(os.path.join(ROOT, 'packages', package, 'pyproject.toml'))['project']
        names = [re.split(r'[\s;(<>=!\[~]', r)[0] for r in project.get('dependencies', [])]
        deps[project['name']] = {n for n in names if n in PACKAGES}
    assert deps['chainermn-tools'] >= {'chainermn-comm'} and 'chainermn' not in deps['chainermn-tools']
    assert 'chainermn-tools' in deps['chainermn']
    seen = []

    def visit(name, path):
        assert name not in path, 'dependency circle: ' + ' -> '.join(path + [name])
        for dep in deps[name]:
            visit(dep, path + [name])
        seen.append(name)

    for name in deps:
        visit(name, [])


def test_one_gpu_install_instruction_naming_what_exists():
    """The GPU hint of comm's errors and the doctor is in the meta-package README verbatim, and every
    extra and CuPy distribution it names is declared in a pyproject."""
    from chainermn_comm.install_hints import GPU_INSTALL_HINT, MPI_INSTALL_HINT
    with open(os.path.join(ROOT, 'packages', 'chainermn', 'README.md')) as f:
        readme = f.read()
    for hint in (GPU_INSTALL_HINT, MPI_INSTALL_HINT):
        assert hint[1:] in readme, hint
    extras = {}
    declared = set()
    for package in PACKAGES:
        project = _toml(os.path.join(ROOT, 'packages', package, 'pyproject.toml'))['project']
        extras[project['name']] = set(project.get('optional-dependencies', {}))
        for items in project.get('optional-dependencies', {}).values():
            declared.update(re.split(r'[\s;(<>=!\[~]', r)[0] for r in items)
    named = re.findall(r'(chainermn(?:-comm)?)\[([a-z0-9-]+)\]', GPU_INSTALL_HINT + MPI_INSTALL_HINT)
    assert named, GPU_INSTALL_HINT
    for dist, extra in named:
        assert extra in extras[dist], (dist, extra, extras[dist])
    for cupy in re.findall(r'cupy-cuda\w+', GPU_INSTALL_HINT):
        assert cupy in declared, (cupy, declared)
