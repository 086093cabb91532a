"""The package's layout holds: no import circles among tritongemm's own modules, every module
imports alone in a fresh interpreter, `import tritongemm` leaves Triton unimported (a kernel's
decoration reads TRITON_INTERPRET, which a program may set after importing tritongemm), and every
function-level import of a tritongemm module says why it is one."""

import ast
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tritongemm"


def _modules() -> dict[str, Path]:
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    return modules


MODULES = _modules()


def _imports(path: Path, name: str):
    """(imported tritongemm module, ast node, inside a function) for each import in `path`."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    inner = {
        id(node)
        for function in ast.walk(tree)
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
        for node in ast.walk(function)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            # A module's own packages are imported before it: no edge back to them.
            if target and target != name and not name.startswith(target + "."):
                yield target, node, id(node) in inner


def test_no_import_circles():
    """Module-level and function-level imports alike: a deferred import hides a circle without
    removing it. Tarjan's strongly connected components of the import graph are single modules."""
    edges = defaultdict(set)
    for name, path in MODULES.items():
        for target, _, _ in _imports(path, name):
            edges[name].add(target)
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                on_stack.discard(w)
                component.append(w)
            on_stack.discard(v)
            if component:
                circles.append(sorted([v, *component]))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for name in MODULES:
        if name not in index:
            visit(name)
    assert circles == []


def test_function_level_imports_say_why():
    """A function-level import of a tritongemm module is for something heavy or optional (Triton,
    whose decoration reads TRITON_INTERPRET; matplotlib; transformers; a command's module, for the
    CLI's start-up): a comment on its line or the line above, or its function's docstring, says so."""
    silent = []
    for path in MODULES.values():
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines))
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            docstring = ast.get_docstring(function) or ""
            for node in ast.walk(function):
                if not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                if not (module or "").startswith("tritongemm"):
                    continue
                said = "#" in lines[node.lineno - 1] or lines[node.lineno - 2].strip().startswith("#")
                if not said and "import" not in docstring:
                    silent.append(f"{path.relative_to(ROOT)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert silent == []


def _fresh(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


def test_importing_tritongemm_imports_no_triton():
    done = _fresh("import sys, tritongemm; print(sorted(m for m in sys.modules if m.split('.')[0] == 'triton'))")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


# Every module, each in an interpreter of its own: one that needs another to be imported first
# (an order that happens to work in the package's __init__) fails here. One fresh interpreter
# imports torch, numpy and triton, then forks a child for each module, which imports it alone:
# a second a module, where a new interpreter each took three.
_EACH_ALONE = """
import importlib, os, sys, traceback
import numpy, torch, triton  # noqa: F401  heavy, and not tritongemm's: shared by every child
failed = []
for name in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
        except BaseException:
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    if status:
        failed.append(name)
print(failed)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks a child a module")
def test_each_module_imports_alone():
    names = [name for name in MODULES if not name.endswith("__main__")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", _EACH_ALONE, *names], env=env, capture_output=True, text=True,
                          timeout=900)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr[-3000:]
