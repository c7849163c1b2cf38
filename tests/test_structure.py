"""The codebase's shape: function size, the layer rule, no import cycles, references that stay inside the
repository.

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
CODE_DIRS = ("mla_fp8_bench", "benchmarks", "scripts", "studies", "tests")


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


#: The package's layers, lowest first: a module imports only from its own layer or lower ones
#: (docs/extending.md's table). A module is in the layer of the longest prefix that names it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("mla_fp8_bench", "mla_fp8_bench.jsonio", "mla_fp8_bench.terminal", "mla_fp8_bench.argtypes")),
    ("problem", ("mla_fp8_bench.problem",)),
    ("aiter_ps", ("mla_fp8_bench.aiter_ps",)),
    ("measure", ("mla_fp8_bench.measure",)),
    ("config", ("mla_fp8_bench.config",)),
    ("backends", ("mla_fp8_bench.backends",)),
    ("peers", ("mla_fp8_bench.peers",)),
    ("harness", ("mla_fp8_bench.harness",)),
    ("analysis", ("mla_fp8_bench.analysis",)),
    ("report", ("mla_fp8_bench.report",)),
    ("testing", ("mla_fp8_bench.testing",)),
    ("cli", ("mla_fp8_bench.cli",)),
)


def _layer_of(module: str) -> int | None:
    best, rank = "", None
    for i, (_, prefixes) in enumerate(LAYERS):
        for pre in prefixes:
            if (module == pre or module.startswith(pre + ".")) and len(pre) > len(best):
                best, rank = pre, i
    return rank


def _upward_imports(root: Path) -> tuple[list[str], list[str]]:
    """(imports from a lower layer to a higher one, modules in no layer) of the package under ``root``."""
    files = {_module_name_under(root, p): p for p in sorted((root / "mla_fp8_bench").rglob("*.py"))}
    modules = set(files)
    up, unplaced = [], []
    for m, path in sorted(files.items()):
        rank = _layer_of(m)
        if rank is None:
            unplaced.append(m)
            continue
        for d in sorted(_imports(path, modules) - {m}):
            dr = _layer_of(d)
            if dr is not None and dr > rank:
                up.append(f"{m} ({LAYERS[rank][0]}) imports {d} ({LAYERS[dr][0]})")
    return up, unplaced


def _module_name_under(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def test_no_import_from_a_lower_layer_to_a_higher_one():
    up, unplaced = _upward_imports(ROOT)
    assert not unplaced, f"modules in no layer of LAYERS (add them to the table and docs/extending.md): {unplaced}"
    assert not up, "imports that run up the layers:\n" + "\n".join(up)


def test_the_layer_check_sees_an_upward_import(tmp_path):
    """The check itself: a measure module importing the harness is reported, a harness one importing
    measure is not."""
    pkg = tmp_path / "mla_fp8_bench"
    for sub in ("measure", "harness"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "measure" / "timing.py").write_text("def f():\n    from mla_fp8_bench.harness.runner import g\n")
    (pkg / "harness" / "runner.py").write_text("from mla_fp8_bench.measure import timing\n\ndef g():\n    pass\n")
    up, unplaced = _upward_imports(tmp_path)
    assert unplaced == []
    assert up == ["mla_fp8_bench.measure.timing (measure) imports mla_fp8_bench.harness.runner (harness)"]


#: Third-party packages of the optional parts (pyproject extras) and of the platforms (aiter, vllm):
#: imported inside the function that needs them, never at a module's top level.
OPTIONAL_PACKAGES = {"matplotlib", "asv", "asv_runner", "fa3_fwd_interface", "cudnn", "aiter", "vllm"}


def _top_level_imports(tree: ast.Module) -> set[str]:
    """Top package names imported by the module's own statements (``if``/``try`` blocks included, function
    and class bodies not)."""
    out: set[str] = set()
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import):
            out |= {a.name.partition(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.partition(".")[0])
        elif isinstance(node, (ast.If, ast.Try)):
            stack.extend(node.body + node.orelse + getattr(node, "finalbody", [])
                         + [s for h in getattr(node, "handlers", []) for s in h.body])
    return out


def test_no_module_imports_an_optional_package_at_import_time():
    bad = []
    for path in _py_files("mla_fp8_bench"):
        hit = _top_level_imports(ast.parse(path.read_text())) & OPTIONAL_PACKAGES
        if hit:
            bad.append(f"{path.relative_to(ROOT)}: {', '.join(sorted(hit))}")
    assert not bad, "optional packages imported at module level:\n" + "\n".join(bad)
    # the check itself
    assert _top_level_imports(ast.parse("import os\ntry:\n    import matplotlib.pyplot\nexcept ImportError:\n"
                                        "    pass\ndef f():\n    import asv\n")) == {"os", "matplotlib"}


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
