"""The package's modules import one another without a circle.

Every module of ``redis_rlock`` is parsed (not imported) and every import it makes of the
package counts: top-level ones, those inside functions and methods, those under
``if TYPE_CHECKING:``, relative and absolute. A circle among them, even one Python resolves at
run time (a local import, an annotation-only one), means two modules can only be understood,
and changed, together; the test names the circle it finds.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Optional

PACKAGE = "redis_rlock"
SRC = Path(__file__).resolve().parent.parent / "src" / PACKAGE


def _modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file of the package."""
    found: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _resolve(importer: str, is_package: bool, level: int, module: Optional[str]) -> str:
    """The absolute name an ``import``/``from`` of ``importer`` names (``level`` dots)."""
    if level == 0:
        return module or ""
    base = importer.split(".")
    if not is_package:
        base.pop()  # a module's relative imports start at its package
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _targets(name: str, modules: dict[str, Path]) -> set[str]:
    """The package's modules an import of ``name`` runs: the deepest existing module named
    (``a.b.c`` where ``c`` is a function of ``a.b``: ``a.b``)."""
    parts = name.split(".")
    while parts:
        dotted = ".".join(parts)
        if dotted in modules:
            return {dotted}
        parts.pop()
    return set()


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its source."""
    modules = _modules(root)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):  # every depth: functions, methods, TYPE_CHECKING blocks
            if isinstance(node, ast.Import):
                for alias in node.names:
                    graph[name] |= _targets(alias.name, modules)
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(name, is_package, node.level, node.module)
                for alias in node.names:
                    # ``from . import x``: x may be a submodule or a name of the package
                    hit = _targets(f"{base}.{alias.name}", modules) or _targets(base, modules)
                    graph[name] |= hit
        graph[name].discard(name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> Optional[list[str]]:
    """One circle of ``graph`` (its modules in import order, the first repeated at the end),
    or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> Optional[list[str]]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def test_the_graph_sees_the_package() -> None:
    """The parse finds the package's modules and the imports known to be there (so an empty
    graph cannot pass the circle check)."""
    graph = import_graph(SRC)
    assert f"{PACKAGE}.aio.session" in graph
    assert f"{PACKAGE}._sessions" in graph[f"{PACKAGE}.aio.session"]  # relative, two dots
    assert f"{PACKAGE}._proto" in graph[f"{PACKAGE}.session"]  # ``from . import _proto``
    assert sum(len(v) for v in graph.values()) > len(graph)


def test_a_circle_is_found(tmp_path: Path) -> None:
    """The checker finds circles made by each kind of import it must see."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n"
    )
    (pkg / "b.py").write_text("def f():\n    from .sub import c\n")
    (pkg / "sub" / "c.py").write_text("from .. import a\n")
    (pkg / "d.py").write_text("import pkg.e\n")
    (pkg / "e.py").write_text("from pkg.sub.c import x\n")
    graph = import_graph(pkg)
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]
    (pkg / "sub" / "c.py").write_text("import os\nimport pkg\n")  # no way back to a
    assert find_cycle(import_graph(pkg)) is None
    (pkg / "e.py").write_text("from pkg.sub.c import x\nimport pkg.d\n")
    assert find_cycle(import_graph(pkg)) == ["pkg.d", "pkg.e", "pkg.d"]


def test_no_import_circle() -> None:
    cycle = find_cycle(import_graph(SRC))
    assert cycle is None, "import circle in the package: " + " -> ".join(cycle or [])
