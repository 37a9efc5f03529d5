"""Nothing outside a communicator's own class reads its private attributes (issue 50).

Siblings reach a communicator through its public methods and properties (``guard``,
``averaging``) and comm's named internal API (``chainermn_comm.engine``).  This walks every
package's sources for ``X._name``, ``getattr(X, '_name')`` and ``X.__dict__`` where ``X`` names
a communicator (``comm``, ``communicator``, ``self.communicator``, ...), outside the modules
that make up the communicator classes.
"""

import ast
import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMM_NAME = re.compile(r'^_*(comm|communicator|comm_\w+|\w+_comm)$')
#: The modules of the communicator classes themselves (their own attributes).
OWN = {
    'chainermn-comm/src/chainermn_comm/_mpi_base.py',
    'chainermn-comm/src/chainermn_comm/reduce/model_collectives.py',
    'chainermn-comm/src/chainermn_comm/_objects.py',
    'chainermn-comm/src/chainermn_comm/naive.py',
}
OWN_DIRS = ('chainermn-comm/src/chainermn_comm/gpu/',)
#: Reads still to be switched to ``comm.guard``: none.
PENDING = set()


def _comm_like(node):
    """Return whether ``node`` (the object of an attribute read) names a communicator."""
    if isinstance(node, ast.Name):
        name = node.id
    elif isinstance(node, ast.Attribute):
        name = node.attr
    else:
        return False
    return bool(COMM_NAME.match(name)) and 'mpi' not in name


def _private(attr):
    return attr.startswith('_') and not (attr.startswith('__') and attr.endswith('__')) or attr == '__dict__'


def _reads(path):
    tree = ast.parse(open(path, encoding='utf-8').read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and _comm_like(node.value):
            yield node.lineno, ast.unparse(node)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ('getattr', 'hasattr', 'setattr') and len(node.args) >= 2 and \
                isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str) and \
                _private(node.args[1].value) and _comm_like(node.args[0]):
            yield node.lineno, ast.unparse(node)


def test_no_module_reads_a_communicators_private_attributes():
    found = []
    for path in sorted(glob.glob(os.path.join(ROOT, 'packages', '*', 'src', '**', '*.py'), recursive=True)):
        rel = os.path.relpath(path, os.path.join(ROOT, 'packages')).replace(os.sep, '/')
        if rel in OWN or rel in PENDING or rel.startswith(OWN_DIRS):
            continue
        found += ['{}:{}: {}'.format(rel, line, text) for line, text in _reads(path)]
    assert not found, 'private attributes of a communicator read outside its class:\n' + '\n'.join(found)


def test_the_check_sees_such_reads(tmp_path):
    p = tmp_path / 'bad.py'
    p.write_text("g = getattr(comm, '_guard', None)\nx = self.communicator._reducer\n"
                 "y = comm.__dict__['_tuned']\nz = comm.rank\nw = self._mpi_comm._x\n")
    assert [line for line, _ in _reads(str(p))] == [1, 2, 3]
