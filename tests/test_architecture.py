"""The shape rules that import-linter's layer contract does not cover, checked on every `make lint`.

* No import cycle between mmfront's modules, counting every import a module makes: at the top,
  inside functions, and under ``TYPE_CHECKING``. A cycle hidden behind a lazy or type-only import
  is still two modules that cannot be understood apart.
* No private name crosses a package: a module whose name starts with ``_`` is imported only from
  its own package, and a ``_name`` is imported only from a module of the same package. What
  another package needs is public, in one home.
* Product code imports no test code: outside ``mmfront.testing`` and ``mmfront.fixtures``, the
  only import of either is the public fixtures API (``mmfront.testing.api``), by the two commands
  that run on fixtures (``mmfront demo``, ``mmfront models``); and the text ``mmfront.testing``
  appears nowhere else in ``src/mmfront``. The layer contract in ``pyproject.toml`` puts the two
  packages above every product layer but ``cli`` and ``demo``; this says which of their names
  those two may use.

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


TEST_CODE = ("mmfront.testing", "mmfront.fixtures")
PUBLIC_FIXTURES_API = "mmfront.testing.api"
FIXTURE_USERS = ("mmfront.cli", "mmfront.demo")
"""The product modules that run on fixtures by design, through :data:`PUBLIC_FIXTURES_API`."""


def imports_of_test_code() -> list[str]:
    """Each import of test code by a product module, but the fixture users' imports of the public
    fixtures API, as ``importer:line imports module``."""
    modules = _modules()
    out: list[str] = []
    for imp in _imports(modules):
        if any(_inside(imp.importer, package) for package in TEST_CODE):
            continue
        if not any(_inside(imp.module, package) for package in TEST_CODE):
            continue
        if imp.module == PUBLIC_FIXTURES_API and imp.importer in FIXTURE_USERS:
            continue
        out.append(f"{imp.importer}:{imp.line} imports {imp.module}")
    return list(dict.fromkeys(out))


def mentions_of_mmfront_testing() -> list[str]:
    """Each line of ``src/mmfront``'s sources outside ``testing/`` naming ``mmfront.testing`` (what
    ``grep -rn mmfront.testing src/mmfront`` finds in a clean clone: no bytecode caches or built
    extensions), but the fixture users' imports of the public fixtures API, as ``path:line``."""
    root = SRC / ROOT
    allowed = {f"{user.rpartition('.')[2]}.py" for user in FIXTURE_USERS}
    out: list[str] = []
    sources = (p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".so")
    for path in sorted(p for p in sources if "testing" not in p.relative_to(root).parts[:1]):
        for n, line in enumerate(path.read_bytes().decode("utf-8", "replace").splitlines(), 1):
            if "mmfront.testing" not in line:
                continue
            if path.parent == root and path.name in allowed and f"from {PUBLIC_FIXTURES_API} import " in line:
                continue
            out.append(f"{path.relative_to(root)}:{n}")
    return out


def test_there_is_no_import_cycle_not_even_a_lazy_or_type_only_one() -> None:
    assert import_cycles() == []


def test_no_private_module_or_name_is_imported_across_packages() -> None:
    assert private_imports() == []


def test_product_code_imports_no_test_code_but_the_public_fixtures_api() -> None:
    assert imports_of_test_code() == []


def test_product_code_names_mmfront_testing_only_in_the_public_fixtures_api_imports() -> None:
    assert mentions_of_mmfront_testing() == []


@pytest.mark.parametrize(("importer", "source", "expected"), [
    ("engine/x.py", "from mmfront.fixtures.bpe import make_tokenizer\n",
     ["mmfront.engine.x:1 imports mmfront.fixtures.bpe"]),
    ("engine/x.py", "def f():\n    from mmfront.testing.api import make_image\n",
     ["mmfront.engine.x:2 imports mmfront.testing.api"]),
    ("demo.py", "from mmfront.testing.media import make_image\n", ["mmfront.demo:1 imports mmfront.testing.media"]),
    ("demo.py", "from mmfront.testing.api import make_image\n", []),
    ("testing/other.py", "from mmfront.fixtures.bpe import make_tokenizer\n", []),
])
def test_the_test_code_check_sees_a_product_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, importer: str,
                                                  source: str, expected: list[str]) -> None:
    tree = tmp_path / ROOT
    for package in ("", "engine", "testing", "fixtures"):
        (tree / package).mkdir(parents=True, exist_ok=True)
        (tree / package / "__init__.py").write_text("")
    for module in ("testing/api.py", "testing/media.py", "fixtures/bpe.py"):
        (tree / module).write_text("def make_image(): ...\n")
    (tree / importer).write_text(source)
    monkeypatch.setitem(globals(), "SRC", tmp_path)
    assert imports_of_test_code() == expected


def test_the_mention_check_sees_a_product_line_naming_mmfront_testing(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    tree = tmp_path / ROOT
    (tree / "engine").mkdir(parents=True)
    (tree / "testing").mkdir()
    (tree / "testing" / "models.py").write_text('"""mmfront.testing.models"""\n')
    (tree / "demo.py").write_text("from mmfront.testing.api import make_image\n# mmfront.testing.media\n")
    (tree / "cli.py").write_text("def f():\n    from mmfront.testing.api import survey_all\n")
    (tree / "engine" / "runner.py").write_text('MESSAGE = "build it with mmfront.testing"\n')
    monkeypatch.setitem(globals(), "SRC", tmp_path)
    assert mentions_of_mmfront_testing() == ["demo.py:2", "engine/runner.py:1"]


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
