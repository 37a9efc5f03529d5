"""The packages talk only through public names, and declare exactly what they import.

- No source file imports another distribution's underscore module (``chainermn_comm._guard``,
  ``from chainermn_comm import _grad``, ``chainermn_comm.gpu._nccl``): siblings use comm's
  public names or its named internal API (``chainermn_comm.engine``).
- Each package's ``[project] dependencies`` are exactly the distributions its sources import;
  an optional dependency (CuPy, matplotlib) may be imported only inside functions and must be
  declared in an extra.  An import inside ``try: ... except ImportError`` is optional by construction
  and need not be declared.
"""

import ast
import glob
import os
import re
import sys

import pytest

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = None

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = sorted(os.path.dirname(p) for p in glob.glob(os.path.join(ROOT, 'packages', '*', 'pyproject.toml')))

#: Third-party import names and the distribution that provides them.  ``cupy`` is provided by
#: any ``cupy-cuda*`` wheel, so it matches every requirement whose name starts with ``cupy``.
THIRD_PARTY = {
    'chainer': 'chainer',
    'numpy': 'numpy',
    'mpi4py': 'mpi4py',
    'cupy': 'cupy',
    'cupyx': 'cupy',
    'cupy_backends': 'cupy',
    'ml_dtypes': 'ml-dtypes',
    'numba': 'numba',
    'pytest': 'pytest',
    'poetry': 'poetry-core',
    'matplotlib': 'matplotlib',
    'threadpoolctl': 'threadpoolctl',
    'zlib_ng': 'zlib-ng',
}
#: Distributions that may be imported only lazily (inside a function), from an extra.
OPTIONAL = {'cupy', 'matplotlib', 'ml-dtypes', 'numba'}


def _canonical(name):
    return re.sub(r'[-_.]+', '-', name).lower()


def _requirement_name(req):
    return _canonical(re.match(r'\s*([A-Za-z0-9][A-Za-z0-9._-]*)', req).group(1))


def _pyproject(pkg):
    if tomllib is None:
        pytest.skip('needs tomllib (Python 3.11+)')
    with open(os.path.join(pkg, 'pyproject.toml'), 'rb') as f:
        return tomllib.load(f)


def _import_names(pkg):
    """Return the top-level import names a package's ``src/`` provides."""
    names = set()
    for entry in os.listdir(os.path.join(pkg, 'src')):
        path = os.path.join(pkg, 'src', entry)
        if os.path.isdir(path) and os.path.exists(os.path.join(path, '__init__.py')):
            names.add(entry)
        elif entry.endswith('.py'):
            names.add(entry[:-3])
    return names


def _owners():
    """Return {top-level import name: distribution} for every package of the repo."""
    owners = {}
    for pkg in PACKAGES:
        dist = _canonical(_pyproject(pkg)['project']['name'])
        for name in _import_names(pkg):
            owners[name] = dist
    return owners


def _sources(pkg):
    return sorted(glob.glob(os.path.join(pkg, 'src', '**', '*.py'), recursive=True))


def _catches_import_error(node):
    names = set()
    for handler in node.handlers:
        types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        names.update(t.id for t in types if isinstance(t, ast.Name))
    return bool(names & {'ImportError', 'ModuleNotFoundError'})


def _imports(path):
    """Yield (line, dotted module, imported names, where) for each absolute import.

    ``where`` is ``'module'`` (runs at import), ``'function'`` (lazy) or ``'optional'``
    (inside ``try: ... except ImportError``).
    """
    with open(path, encoding='utf-8') as f:
        tree = ast.parse(f.read(), path)

    def walk(node, where):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield child.lineno, alias.name, (), where
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                yield child.lineno, child.module, tuple(a.name for a in child.names), where
            if isinstance(child, ast.Try) and _catches_import_error(child):
                for stmt in child.body:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), 'optional')
                for part in child.handlers + child.orelse + child.finalbody:
                    yield from walk(ast.Module(body=[part], type_ignores=[]), where)
                continue
            inner = 'function' if where == 'module' and isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) else where
            yield from walk(child, inner)

    yield from walk(tree, 'module')


#: Sub-packages internal to their distribution although their names have no underscore: siblings
#: reach them only through a named internal API (``chainermn_comm.reduce`` through ``engine``).
INTERNAL_SUBPACKAGES = ('chainermn_comm.reduce',)


def _private_parts(module, names):
    parts = module.split('.')[1:] + list(names)
    private = [p for p in parts if p.startswith('_') and not (p.startswith('__') and p.endswith('__'))]
    dotted = [module + '.' + n for n in names] + [module]
    private += [i for i in INTERNAL_SUBPACKAGES if any(d == i or d.startswith(i + '.') for d in dotted)]
    return private


@pytest.mark.parametrize('pkg', PACKAGES, ids=os.path.basename)
def test_no_package_imports_another_packages_underscore_modules(pkg):
    owners = _owners()
    mine = _import_names(pkg)
    bad = []
    for path in _sources(pkg):
        for line, module, names, _ in _imports(path):
            top = module.split('.')[0]
            if top in mine or top not in owners:
                continue
            private = _private_parts(module, names)
            if private:
                what = module + (' import ' + ', '.join(names) if names else '')
                bad.append('{}:{}: {} (underscore: {})'.format(
                    os.path.relpath(path, ROOT), line, what, ', '.join(private)))
    assert not bad, ('{} imports underscore modules of other packages; use their public names or '
                     'a named internal API (e.g. chainermn_comm.engine):\n{}'.format(
                         os.path.basename(pkg), '\n'.join(bad)))


def _imported_distributions(pkg):
    """Return ({distribution: [where]} imported at module level, {distribution: [where]} lazily)."""
    owners = _owners()
    mine = _import_names(pkg)
    stdlib = set(sys.stdlib_module_names)
    eager, lazy, unknown = {}, {}, []
    for path in _sources(pkg):
        for line, module, _, kind in _imports(path):
            top = module.split('.')[0]
            if top in mine or top in stdlib or kind == 'optional':
                continue
            where = '{}:{}'.format(os.path.relpath(path, ROOT), line)
            dist = owners.get(top) or THIRD_PARTY.get(top)
            if dist is None:
                unknown.append('{} ({})'.format(top, where))
                continue
            (lazy if kind == 'function' else eager).setdefault(dist, []).append(where)
    assert not unknown, ('imports of modules this test cannot map to a distribution; add them to '
                         'THIRD_PARTY in tests/test_layering.py: {}'.format(', '.join(unknown)))
    return eager, lazy


def _projects():
    return {_canonical(_pyproject(p)['project']['name']): _pyproject(p)['project'] for p in PACKAGES}


def _extra_provides(requirement, dist, projects, depth=0):
    """Return True when ``requirement`` (e.g. ``cupy-cuda12x``, ``chainermn-comm[gpu]``) brings ``dist``."""
    name = _requirement_name(requirement)
    if name == dist or (dist in OPTIONAL and name.startswith(dist)):
        return True
    extras = re.match(r'\s*[A-Za-z0-9._-]+\s*\[([^\]]*)\]', requirement)
    if not extras or name not in projects or depth > 5:
        return False
    sibling = projects[name].get('optional-dependencies', {})
    return any(_extra_provides(r, dist, projects, depth + 1)
               for extra in extras.group(1).split(',') for r in sibling.get(extra.strip(), []))


@pytest.mark.parametrize('pkg', PACKAGES, ids=os.path.basename)
def test_declared_dependencies_are_exactly_the_imported_distributions(pkg):
    project = _pyproject(pkg)['project']
    declared = {_requirement_name(r) for r in project.get('dependencies', [])}
    extras = [r for reqs in project.get('optional-dependencies', {}).values() for r in reqs]
    projects = _projects()
    eager, lazy = _imported_distributions(pkg)
    problems = []
    needed = set(eager) | {d for d in lazy if d not in OPTIONAL}
    for dist in sorted(set(eager) & OPTIONAL):
        problems.append('{} is optional but imported at module level ({}): import it inside the '
                        'function that needs it'.format(dist, ', '.join(eager[dist])))
    for dist in sorted(d for d in lazy if d in OPTIONAL):
        if not any(_extra_provides(r, dist, projects) for r in extras):
            problems.append('{} is imported ({}) but no extra declares it'.format(
                dist, ', '.join(lazy[dist][:3])))
    needed -= OPTIONAL
    for dist in sorted(needed - declared):
        where = (eager.get(dist) or lazy.get(dist))[:3]
        problems.append('{} is imported ({}) but not in [project] dependencies'.format(
            dist, ', '.join(where)))
    for dist in sorted(declared - needed):
        problems.append('{} is in [project] dependencies but nothing in src/ imports it'.format(dist))
    assert not problems, '{}: declared dependencies differ from the imports:\n{}'.format(
        os.path.basename(pkg), '\n'.join(problems))
