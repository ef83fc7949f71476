"""The shape rules that import-linter's layer contract does not cover, checked on every `make lint`.

* No import cycle between mmfront's modules, counting every import a module makes: at the top,
  inside functions, and under ``TYPE_CHECKING``. A cycle hidden behind a lazy or type-only import
  is still two modules that cannot be understood apart.
* No private name crosses a package: a module whose name starts with ``_`` is imported only from
  its own package, and a ``_name`` is imported only from a module of the same package. What
  another package needs is public, in one home.

The import graph is read from the source (``ast``), so nothing is imported to check it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = "mmfront"


@dataclass(frozen=True)
class Import:
    importer: str
    """The importing module's dotted name."""
    module: str
    """The imported module (for ``from pkg import sub``, ``pkg.sub`` when ``sub`` is a module)."""
    name: str | None
    """The imported name, for ``from module import name``."""
    line: int


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted((SRC / ROOT).rglob("*.py"))}


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _imports(modules: dict[str, Path]) -> Iterator[Import]:
    for importer, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == ROOT or alias.name.startswith(ROOT + "."):
                        yield Import(importer, alias.name, None, node.lineno)
            elif isinstance(node, ast.ImportFrom):
                module = _resolve(importer, is_package, node)
                if module != ROOT and not module.startswith(ROOT + "."):
                    continue
                for alias in node.names:
                    sub = f"{module}.{alias.name}"
                    if sub in modules:
                        yield Import(importer, sub, None, node.lineno)
                    else:
                        yield Import(importer, module, alias.name, node.lineno)


def _package(module: str, modules: dict[str, Path]) -> str:
    """The package a module belongs to (a package belongs to itself)."""
    return module if modules[module].name == "__init__.py" else module.rpartition(".")[0]


def import_cycles() -> list[list[str]]:
    """Every strongly connected set of two or more modules (Tarjan), each sorted."""
    modules = _modules()
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for imp in _imports(modules):
        if imp.module in modules and imp.module != imp.importer:
            edges[imp.importer].add(imp.module)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for module in sorted(modules):
        if module not in index:
            visit(module)
    return found


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def private_imports() -> list[str]:
    """Each import of a private module or name from outside the package that owns it (its
    subpackages are inside), as ``importer:line``."""
    modules = _modules()
    out: list[str] = []
    for imp in _imports(modules):
        if imp.module not in modules:
            continue
        owner, _, leaf = imp.module.rpartition(".")
        if leaf.startswith("_") and not leaf.startswith("__") and not _inside(imp.importer, owner):
            out.append(f"{imp.importer}:{imp.line} imports private module {imp.module}")
        elif imp.name is not None and imp.name.startswith("_") and not imp.name.startswith("__") \
                and not _inside(imp.importer, _package(imp.module, modules)):
            out.append(f"{imp.importer}:{imp.line} imports private name {imp.module}.{imp.name}")
    return list(dict.fromkeys(out))


def test_there_is_no_import_cycle_not_even_a_lazy_or_type_only_one() -> None:
    assert import_cycles() == []


def test_no_private_module_or_name_is_imported_across_packages() -> None:
    assert private_imports() == []


@pytest.mark.parametrize(("source", "expected"), [
    ("from mmfront.cache._lrumap import LRUCache\n", ["mmfront.engine.x:1 imports private module mmfront.cache._lrumap"]),
    ("from mmfront.cache.lru import _no_data_error\n",
     ["mmfront.engine.x:1 imports private name mmfront.cache.lru._no_data_error"]),
    ("from mmfront.cache.lru import LruKeyReplicatedSenderCache\n", []),
])
def test_the_private_import_check_sees_a_crossing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str,
                                                  expected: list[str]) -> None:
    """The checks read a tree of files: a planted module shows that each one can fail."""
    tree = tmp_path / ROOT
    for package in ("", "cache", "engine"):
        (tree / package).mkdir(parents=True, exist_ok=True)
        (tree / package / "__init__.py").write_text("")
    (tree / "cache" / "_lrumap.py").write_text("class LRUCache: ...\n")
    (tree / "cache" / "lru.py").write_text("from mmfront.cache._lrumap import LRUCache\n"
                                           "def _no_data_error(): ...\nclass LruKeyReplicatedSenderCache: ...\n")
    (tree / "engine" / "x.py").write_text(source)
    monkeypatch.setitem(globals(), "SRC", tmp_path)
    assert private_imports() == expected


def test_the_cycle_check_sees_a_planted_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = tmp_path / ROOT
    (tree / "a").mkdir(parents=True)
    (tree / "__init__.py").write_text("")
    (tree / "a" / "__init__.py").write_text("")
    (tree / "a" / "one.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                       "    from mmfront.a.two import B\n")
    (tree / "a" / "two.py").write_text("def f():\n    from mmfront.a import one\n")
    (tree / "a" / "three.py").write_text("from mmfront.a.one import A\n")
    monkeypatch.setitem(globals(), "SRC", tmp_path)
    assert import_cycles() == [["mmfront.a.one", "mmfront.a.two"]]
