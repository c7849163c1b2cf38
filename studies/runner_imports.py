"""Lines of the mla_fp8_bench modules an ``asv run`` of the ``aiter`` backend imports.

Run from the checkout: ``python studies/runner_imports.py``. It does in one process what asv does over
its benchmark processes: discovery (import ``benchmarks/bench_mla_prefill.py``), each class's
``setup_cache`` with ``MLA_FP8_BENCH_BACKENDS=aiter`` (as a gfx950 runner configures it), a ``setup``
and a ``track_*`` call, and a latency round's module (``mla_fp8_bench.harness.rounds``, which round
children run). It then lists the ``mla_fp8_bench`` modules in ``sys.modules`` with their line counts.
Modules that must stay off this path (peers, analysis, report, the emulator) are flagged.
"""

import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("MLA_FP8_BENCH_BACKENDS", "aiter")
os.environ.setdefault("MLA_FP8_BENCH_CASES", "s128")
os.environ.setdefault("MLA_FP8_BENCH_CEILINGS", "1")
OFF_PATH = ("mla_fp8_bench.peers", "mla_fp8_bench.analysis", "mla_fp8_bench.report",
            "mla_fp8_bench.aiter_ps.emulator", "mla_fp8_bench.aiter_ps.standin", "mla_fp8_bench.aiter_ps.planner")


def main() -> int:
    spec = importlib.util.spec_from_file_location("bench_mla_prefill", ROOT / "benchmarks" / "bench_mla_prefill.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    for cls in (bench.MLAPrefill, bench.AiterPlan):
        obj = cls()
        cache = obj.setup_cache()
        b, c = cls.params[0][0], cls.params[1][0]
        try:
            obj.setup(cache, b, c)
        except (NotImplementedError, RuntimeError):
            pass  # a skip on a machine without the backend
    importlib.import_module("mla_fp8_bench.harness.rounds")
    mods = sorted(n for n in sys.modules if n == "mla_fp8_bench" or n.startswith("mla_fp8_bench."))
    total, bad = 0, []
    for name in mods:
        f = getattr(sys.modules[name], "__file__", None)
        n = len(Path(f).read_text().splitlines()) if f else 0
        total += n
        flag = " OFF-PATH" if name.startswith(OFF_PATH) else ""
        bad += [name] if flag else []
        print(f"{n:6d}  {name}{flag}")
    print(f"{total:6d}  total, {len(mods)} modules; off-path modules imported: {bad or 'none'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
