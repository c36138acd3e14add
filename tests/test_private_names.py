"""No private upstream name outside the compat seam (``fast_parallel/compat``).

Every ``._name`` attribute and every ``'_name'`` string in the package's code
outside ``fast_parallel/compat/`` must be a name fast_parallel itself defines
(a function, class, attribute or variable of its own), so that a torch /
mmengine / mmdet internal is named in one place only, where a version bump
is checked and a missing one fails with ``CompatError``.
"""
import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / 'fast_parallel'
SEAM = PACKAGE / 'compat'
#: Public API that happens to start with an underscore (namedtuple's).
PUBLIC = {'_fields', '_asdict', '_replace', '_make'}
PRIVATE = re.compile(r'^_[A-Za-z][A-Za-z0-9_]*$')
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
DOTTED = re.compile(r'^[A-Za-z0-9_.]+$')


def _sources():
    return sorted(PACKAGE.rglob('*.py'))


def _own_names() -> set:
    """Every private identifier the package defines (anywhere, the seam
    included: a name the seam defines is fast_parallel's)."""
    own = set()
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, DEFINITIONS):
                own.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(
                    node.ctx, ast.Store):
                own.add(node.id)
            elif (isinstance(node, ast.Attribute)
                  and isinstance(node.ctx, ast.Store)
                  and isinstance(node.value, ast.Name)
                  and node.value.id in ('self', 'cls')):
                own.add(node.attr)  # an attribute of one of its classes
            elif isinstance(node, ast.arg):
                own.add(node.arg)
    return {n for n in own if PRIVATE.match(n)}


def _uses(path: Path):
    """(line, name) of every private attribute or string in a module."""
    tree = ast.parse(path.read_text())
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                             ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(
                    first.value, ast.Constant):
                docstrings.add(id(first.value))
        if isinstance(node, ast.JoinedStr):  # f-string text is prose
            docstrings.update(id(v) for v in node.values)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and PRIVATE.match(node.attr):
            yield node.lineno, node.attr
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docstrings
              and DOTTED.match(node.value)):  # a name, not prose
            for part in node.value.split('.'):
                if PRIVATE.match(part):
                    yield node.lineno, part
        elif isinstance(node, ast.ImportFrom) and node.module:
            for part in node.module.split('.') + [a.name for a in node.names]:
                if PRIVATE.match(part):
                    yield node.lineno, part


def test_private_upstream_names_only_in_the_seam():
    own = _own_names() | PUBLIC
    found = []
    for path in _sources():
        if SEAM in path.parents:
            continue
        for line, name in _uses(path):
            # attributes fast_parallel sets on upstream objects carry its name
            if name not in own and not name.startswith('_fast_parallel'):
                found.append(f'{path.relative_to(PACKAGE.parent)}:{line} '
                             f'{name}')
    assert found == []


def test_the_check_sees_upstream_names():
    # the names the seam is there for are not taken for fast_parallel's own
    own = _own_names()
    for name in ('_train_loop', '_iterator', '_run_forward', '_data_fields',
                 '_init_group', '_max_epochs', '_InfiniteDataloaderIterator',
                 '_resume', '_dataloader'):
        assert name not in own, name
