"""Import structure of the rlft package: circles among its modules and imports inside functions.

Usage: python scripts/import_stats.py [ROOT]   (ROOT: the repository, default: this one)

Prints (a) the import circles among rlft modules counting module-level imports only (those run
when a module is imported; ``if TYPE_CHECKING:`` blocks excluded), (b) the circles when imports
inside functions count too, (c) the number of imports inside functions, per module and in all,
(d) the circles when the type-only imports (``if TYPE_CHECKING:``) count too: two modules that name
each other's types are one job split in two, or one of them holds a type that belongs lower.
tests/test_errors.py checks (a), (b) and (d) with these functions.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _targets(node: ast.Import | ast.ImportFrom, modules: set[str]) -> set[str]:
    """The rlft modules an import statement loads (``from pkg import mod`` loads ``pkg.mod`` when it is one)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        names = [base] + [f"{base}.{a.name}" for a in node.names]
    return {n for n in names if n in modules}


def imports(root: Path) -> tuple[dict[str, set[str]], dict[str, set[str]], dict[str, int], dict[str, set[str]]]:
    """``(top, inner, counts, typed)``: per rlft module, the rlft modules it imports at module level, those it
    imports inside functions, how many import statements sit inside functions (of any module), and the rlft
    modules it imports under ``if TYPE_CHECKING:``."""
    files = {module_name(p, root): p for p in sorted((root / "rlft").rglob("*.py"))}
    modules = set(files)
    top: dict[str, set[str]] = {m: set() for m in modules}
    inner: dict[str, set[str]] = {m: set() for m in modules}
    counts: dict[str, int] = {m: 0 for m in modules}
    typed: dict[str, set[str]] = {m: set() for m in modules}

    def visit(node: ast.AST, mod: str, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for n in ast.walk(child):
                    if isinstance(n, (ast.Import, ast.ImportFrom)):
                        typed[mod] |= _targets(n, modules)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                (inner if in_function else top)[mod] |= _targets(child, modules)
                counts[mod] += in_function
                continue
            visit(child, mod, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    for mod, path in files.items():
        visit(ast.parse(path.read_text()), mod, False)
    for deps in (top, inner):  # importing a.b.c runs a/__init__ and a/b/__init__ first (unless running already)
        for mod in modules:
            for dep in list(deps[mod]):
                parts = dep.split(".")
                deps[mod] |= {p for i in range(1, len(parts)) if (p := ".".join(parts[:i])) in modules
                              and not (mod == p or mod.startswith(p + "."))}
    return top, inner, counts, typed


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: each strongly connected component of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(found)


def report(root: Path) -> tuple[list[list[str]], list[list[str]], dict[str, int], list[list[str]]]:
    """``(a, b, c, d)`` of the module docstring."""
    top, inner, counts, typed = imports(root)
    both = {m: top[m] | inner[m] for m in top}
    return circles(top), circles(both), counts, circles({m: both[m] | typed[m] for m in top})


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    module_level, with_inner, counts, with_types = report(root)
    print(f"(a) import circles, module-level imports: {len(module_level)}")
    for c in module_level:
        print("    " + " <-> ".join(c))
    print(f"(b) import circles, imports inside functions counted too: {len(with_inner)}")
    for c in with_inner:
        print("    " + " <-> ".join(c))
    print(f"(c) imports inside functions: {sum(counts.values())}")
    for mod, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if n:
            print(f"    {n:4d}  {mod}")
    print(f"(d) import circles, type-only imports counted too: {len(with_types)}")
    for c in with_types:
        print("    " + " <-> ".join(c))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
