"""No import circle between the modules of packages/*/src (imports as written, lazy ones included).

Every ``import`` and ``from ... import`` statement of every module counts, wherever it stands (at
the top, inside a function, under ``if TYPE_CHECKING``): a circle is two modules that each need the
other to be read, which makes the order of imports matter and the layers hard to see.  A package's
``__init__`` counts as the module of the package; ``from pkg import name`` counts as an import of
``pkg.name`` when that is a module, else of ``pkg``.
"""

import ast
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = os.path.join(REPO, 'packages')

#: Circles still known (each a sorted tuple of module names), with why; none today.
KNOWN = set()


def _modules():
    """Return {module name: path} of every module under packages/*/src."""
    found = {}
    for pkg in sorted(os.listdir(PACKAGES)):
        src = os.path.join(PACKAGES, pkg, 'src')
        if not os.path.isdir(src):
            continue
        for root, dirs, files in os.walk(src):
            dirs[:] = sorted(d for d in dirs if d != '__pycache__' and not d.startswith('.'))
            for f in sorted(files):
                if not f.endswith('.py'):
                    continue
                rel = os.path.relpath(os.path.join(root, f), src)[:-3].split(os.sep)
                if rel[-1] == '__init__':
                    rel = rel[:-1]
                if rel:
                    found['.'.join(rel)] = os.path.join(root, f)
    return found


def _imports(name, path, modules):
    """Return the set of modules of ``modules`` that module ``name`` imports (anywhere in it)."""
    with open(path, encoding='utf-8') as f:
        tree = ast.parse(f.read(), path)
    is_pkg = os.path.basename(path) == '__init__.py'
    package = name if is_pkg else name.rpartition('.')[0]
    out = set()

    def add(target):
        # The deepest module of ``target`` we know (a.b.c -> a.b when c is a name in a.b).
        while target and target not in modules:
            target = target.rpartition('.')[0]
        if target and target != name:
            out.add(target)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split('.')
                base = base[:len(base) - (node.level - 1)]
                base = '.'.join(base + ([node.module] if node.module else []))
            else:
                base = node.module or ''
            for alias in node.names:
                full = base + '.' + alias.name
                if full in modules:
                    add(full)
                else:
                    add(base)
    return out


def _graph():
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _circles(graph):
    """Return the strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        work = [(v, iter(sorted(graph[v])))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        out.append(tuple(sorted(comp)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_finder_sees_lazy_imports_and_circles():
    graph = {'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}, 'e': set()}
    assert _circles(graph) == [('a', 'b', 'c')]
    modules = _modules()
    # A lazy import inside a function counts (the guard's call module imports mpi4py lazily,
    # the package's own modules at the top).
    assert 'chainermn_comm.guard.report' in _imports(
        'chainermn_comm.guard.call', modules['chainermn_comm.guard.call'], modules)


def test_no_import_circle_in_packages():
    circles = [c for c in _circles(_graph()) if c not in KNOWN]
    assert circles == [], 'import circles (modules that import each other, lazily or not): {}'.format(
        '; '.join(' <-> '.join(c) for c in circles))
