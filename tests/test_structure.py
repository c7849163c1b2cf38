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


#: The one module that reads configuration from the environment (RunConfig.from_env: MLA_FP8_BENCH_*,
#: asv's ASV_* variables and its parent process), and modules that read a fact of the process that is
#: not configuration, with the variable.
ENV_READERS = {
    "mla_fp8_bench.config": "the configuration boundary",
    "mla_fp8_bench.terminal": "COLUMNS (the terminal's width)",
    "mla_fp8_bench.measure.clocks": "CUDA_VISIBLE_DEVICES (the driver's device mapping)",
    "mla_fp8_bench.analysis.nightly": "the asv child's environment (a variable the caller set is kept)",
}


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return base and f"{base}.{node.attr}"
    return None


def _environment_reads(tree: ast.Module) -> list[str]:
    """``os.environ`` / ``os.getenv`` uses other than handing the whole environment to a child process
    (``dict(os.environ)``, ``{**os.environ, ...}``), as ``line: source``."""
    parent = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
    out = []
    for node in ast.walk(tree):
        name = _dotted(node) if isinstance(node, (ast.Attribute, ast.Name)) else None
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            name = next((f"os.{a.name}" for a in node.names if a.name in ("environ", "getenv", "putenv")), None)
        elif name not in ("os.environ", "os.getenv", "os.putenv", "os.unsetenv"):
            continue
        if name is None:
            continue
        up = parent.get(node)
        copied = (isinstance(up, ast.Call) and _dotted(up.func) == "dict" and up.args == [node]) or (
            isinstance(up, ast.Dict) and any(k is None and v is node for k, v in zip(up.keys, up.values)))
        if not copied:
            out.append(f"{node.lineno}: {ast.unparse(parent.get(node, node))[:80]}")
    return out


def _env_readers_under(root: Path) -> dict[str, list[str]]:
    files = {_module_name_under(root, p): p for p in sorted((root / "mla_fp8_bench").rglob("*.py"))}
    found = {m: _environment_reads(ast.parse(p.read_text())) for m, p in files.items() if m not in ENV_READERS}
    return {m: hits for m, hits in found.items() if hits}


def test_only_the_configuration_boundary_reads_the_environment():
    """Configuration travels as a RunConfig (mla_fp8_bench/config.py), never through os.environ."""
    found = _env_readers_under(ROOT)
    assert not found, "modules reading the environment outside mla_fp8_bench.config:\n" + "\n".join(
        f"{m}:{h}" for m, hits in found.items() for h in hits)
    assert "MLA_FP8_BENCH_" in (PKG / "config.py").read_text()


#: Calls allowed in a module-level statement: pure constructors of constant values.
PURE_CALLS = {"frozenset", "tuple", "set", "dict", "list", "float", "int", "str", "bool", "repr", "range", "sorted",
              "len", "enumerate", "zip", "re.compile", "TypeVar", "namedtuple", "field", "Path",
              "types.SimpleNamespace", "itertools.count", "torch.finfo", "math.log2", "math.sqrt"}
#: str methods (on a literal or a comprehension's variable).
PURE_METHODS = {"upper", "lower", "strip", "join", "replace", "format", "split"}
#: Modules of constant tables whose functions are pure lookups (a module may derive its constants from them).
TABLE_MODULES = ("mla_fp8_bench.measure.metric_table",)


def _table_names(tree: ast.Module) -> set[str]:
    """Names bound to a :data:`TABLE_MODULES` module or to a function imported from one."""
    out: set[str] = set()
    for st in tree.body:
        if isinstance(st, ast.ImportFrom) and st.module in TABLE_MODULES:
            out |= {a.asname or a.name for a in st.names}
        elif isinstance(st, ast.ImportFrom) and st.module:
            out |= {a.asname or a.name for a in st.names if f"{st.module}.{a.name}" in TABLE_MODULES}
        elif isinstance(st, ast.Import):
            out |= {a.asname for a in st.names if a.name in TABLE_MODULES and a.asname}
    return out


def _simple(node: ast.AST, local: set[str]) -> bool:
    """Whether evaluating ``node`` is constant construction: literals, names, operators, comprehensions,
    and calls of :data:`PURE_CALLS`, of a function / class the module itself defines, or of a table
    module's function (``local`` holds those names)."""
    if isinstance(node, ast.Call):
        f = _dotted(node.func) or ""
        method = isinstance(node.func, ast.Attribute) and node.func.attr in PURE_METHODS
        if not (f in PURE_CALLS or f in local or f.split(".")[0] in local or method):
            return False
    if isinstance(node, ast.Lambda):
        return True
    return all(_simple(c, local) for c in ast.iter_child_nodes(node))


def _import_time_work(tree: ast.Module) -> list[str]:
    """Module-level statements that do work when the module is imported, as ``line: source``. Allowed:
    imports, defs and classes, docstrings, ``if TYPE_CHECKING:``, ``if __name__ == "__main__":``,
    ``__all__`` and assignments / asserts of :func:`_simple` expressions."""
    local = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    local |= _table_names(tree)
    out = []
    for st in tree.body:
        if isinstance(st, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                           ast.Pass)):
            continue
        if isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant):
            continue
        if isinstance(st, ast.If) and (_dotted(st.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING") or (
                isinstance(st.test, ast.Compare) and _dotted(st.test.left) == "__name__")):
            continue
        if isinstance(st, ast.Try) and all(isinstance(x, (ast.Import, ast.ImportFrom)) for x in st.body):
            continue
        value = st.test if isinstance(st, ast.Assert) else getattr(st, "value", None)
        if isinstance(st, (ast.Assign, ast.AnnAssign, ast.Assert)) and value is not None and _simple(value, local):
            continue
        out.append(f"{st.lineno}: {ast.unparse(st)[:90]}")
    return out


def _import_time_work_under(root: Path) -> dict[str, list[str]]:
    found = {_module_name_under(root, p): _import_time_work(ast.parse(p.read_text()))
             for p in sorted((root / "mla_fp8_bench").rglob("*.py"))}
    return {m: hits for m, hits in found.items() if hits}


def test_no_module_does_work_at_import_time():
    """Importing a module builds no backend, runs no guard, reads no file: asv imports the suite to
    discover it, and every CLI command imports the package."""
    found = _import_time_work_under(ROOT)
    assert not found, "module-level work:\n" + "\n".join(f"{m}:{h}" for m, hits in found.items() for h in hits)


def test_the_environment_and_import_time_checks_see_a_violation(tmp_path):
    pkg = tmp_path / "mla_fp8_bench"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""ok"""\nimport os\n\nNAMES = tuple(f"s{i}" for i in (1, 2))\n'
                                     'ENV = dict(os.environ)\n')
    (pkg / "knob.py").write_text('import os\nfrom mla_fp8_bench import registry\n\n'
                                 'def cap():\n    return os.environ.get("MLA_FP8_BENCH_CAP")\n\n'
                                 'GRID = tuple(b for b in registry.names() if b)\n')
    assert set(_env_readers_under(tmp_path)) == {"mla_fp8_bench.knob"}
    assert list(_import_time_work_under(tmp_path)) == ["mla_fp8_bench.knob"]


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


def test_no_code_reads_another_processs_state():
    """Nothing reads /proc/<pid> (another process's argv, cwd or file descriptors): asv runs the suite as a
    child, and what it needs to know comes through its configuration (the machine's /proc/cpuinfo is no
    process's)."""
    pid_state = re.compile(r"/proc/(?!cpuinfo\b|meminfo\b)|getppid")
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in _py_files("mla_fp8_bench", "benchmarks")
            for i, line in enumerate(p.read_text().splitlines(), 1) if pid_state.search(line)]
    assert not hits, "reads of another process's state:\n" + "\n".join(hits)
