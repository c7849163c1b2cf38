"""The codebase's shape: function size, no import cycles, references that stay inside the repository.

These are the structural promises of docs/extending.md, checked on the source text (nothing is run).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "mla_fp8_bench"
MAX_FUNCTION_LINES = 120
CODE_DIRS = ("mla_fp8_bench", "benchmarks", "scripts", "tests")


def _py_files(*dirs: str) -> list[Path]:
    return sorted(p for d in dirs for p in (ROOT / d).rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def test_no_library_function_over_the_limit():
    long = []
    for path in _py_files("mla_fp8_bench"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Package modules imported anywhere in ``path`` (module level or inside functions)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != "mla_fp8_bench":
                out.add(name)
    return out


def test_no_import_cycle_inside_the_package():
    files = {_module_name(p): p for p in _py_files("mla_fp8_bench")}
    modules = set(files)
    graph = {m: _imports(p, modules) - {m} for m, p in files.items()}
    # a package's __init__ importing its own submodules is its face, not a cycle
    graph = {m: {d for d in deps if not d.startswith(m + ".")} for m, deps in graph.items()}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d):] + [d] if d in stack else [m, d])
            elif d not in state:
                visit(d, stack + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


_OUTSIDE_CODE = re.compile(r"\.\./shared|shared/docs|shared/data|§")
# docs may use § for their own sections; not for another document's
_OUTSIDE_DOCS = re.compile(r"\.\./shared|shared/docs|shared/data|(contract|doc|doc's|docs)\s+§")


@pytest.mark.parametrize("where", CODE_DIRS + ("docs",))
def test_no_reference_to_documents_outside_the_repository(where):
    bad = []
    files = _py_files(where) if where != "docs" else sorted((ROOT / "docs").rglob("*.md"))
    for path in files:
        if path.name == Path(__file__).name:
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            hit = (_OUTSIDE_DOCS if where == "docs" else _OUTSIDE_CODE).search(line)
            if hit and hit.group(0) == "§" and re.search(r"docs/[\w.-]+\.md", line):
                continue  # a section of one of the repository's own docs (checked to exist below)
            if hit:
                bad.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()[:100]}")
    assert not bad, "references to documents outside the repository:\n" + "\n".join(bad)


def test_every_doc_the_code_names_exists():
    named = set()
    for path in _py_files(*CODE_DIRS) + [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md")):
        named |= set(re.findall(r"\bdocs/[\w./-]+\.md\b", path.read_text()))
    missing = sorted(n for n in named if not (ROOT / n).is_file())
    assert named and not missing, f"docs named in code but absent: {missing}"
