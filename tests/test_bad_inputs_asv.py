"""Stored values and asv runs (docs/robustness.md section J): real asv 0.6.6 runs in a temporary results
directory. A run that selects part of the grid (``asv run -b`` with the knobs ``selection_knobs``
derives from it, as ``nightly`` runs) keeps the stored values of the others; a bad knob, or other code
than the commit named, is refused while asv discovers the benchmarks, before it writes anything.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ASV = Path(sys.executable).parent / "asv"
BENCH = "bench_mla_prefill.MLAPrefill.track_max_abs_error"
ONE = r"\('torch-fp8-ref', 's128'\)"

# real asv runs, 8-16 s each on a 2-core CPU: `pytest -m slow` (CI runs them as their own step)
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not ASV.exists() and shutil.which("asv") is None,
                                 reason="asv is not installed (pip install -e '.[test]')")]


def _head() -> str:
    """A fixed commit of this repository for ``--set-commit-hash`` (HEAD moves while tests run)."""
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "a112cba"], capture_output=True, text=True,
                          check=True).stdout.strip()


def _setup(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A config whose results go to tmp_path, a machine file in a tmp HOME; returns (config, env)."""
    text = "\n".join(x for x in (ROOT / "asv.conf.json").read_text().splitlines() if not x.lstrip().startswith("//"))
    conf = json.loads(text)
    conf.update(repo=str(ROOT), benchmark_dir=str(ROOT / "benchmarks"), results_dir="results",
                html_dir=str(tmp_path / "html"), env_dir=str(tmp_path / "env"))
    (tmp_path / "conf").mkdir()
    cfg = tmp_path / "conf" / "asv.conf.json"
    cfg.write_text(json.dumps(conf))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLA_FP8_BENCH_", "ASV"))}
    # ASV_PYTHONPATH: asv clears PYTHONPATH; the benchmarks import this checkout's package, not an installed one
    env.update(HOME=str(tmp_path), MLA_FP8_BENCH_TIME_BUDGET="0.2", MLA_FP8_BENCH_SAMPLES="2",
               MLA_FP8_BENCH_DEVICE="cpu", ASV_PYTHONPATH=str(ROOT))
    subprocess.run([str(ASV), "machine", "--yes", "--machine", "pytest-cpu"], cwd=cfg.parent, env=env, check=True,
                   capture_output=True)
    return cfg, env


def _asv_run(cfg: Path, env: dict[str, str], head: str, select: str, **knobs: str) -> subprocess.CompletedProcess:
    """``asv run -b`` of ``track_max_abs_error`` on the params ``select`` picks (a regex over
    ``('backend', 'case')``), with the knobs that measure only those, then ``knobs``."""
    from mla_fp8_bench.harness.asv_support import selection_knobs

    bench = r"MLAPrefill\.track_max_abs_error" + select
    return subprocess.run(
        [str(ASV), "run", "--config", str(cfg), "--machine", "pytest-cpu", "-E", f"existing:{sys.executable}",
         "--set-commit-hash", head, "--quick", "-b", bench],
        cwd=cfg.parent, env={**env, **selection_knobs(bench), **knobs}, capture_output=True, text=True,
        timeout=600)


def _stored(cfg: Path, head: str) -> tuple[Path, dict[tuple[str, str], float | None]]:
    (path,) = (cfg.parent / "results" / "pytest-cpu").glob(f"{head[:8]}-*.json")
    doc = json.loads(path.read_text())
    row = dict(zip(doc["result_columns"], doc["results"][BENCH]))
    backends, cases = ([json.loads(x.replace("'", '"')) for x in p] for p in row["params"])
    vals = iter(row["result"])
    return path, {(b, c): next(vals) for b in backends for c in cases}


def test_a_selecting_asv_run_keeps_the_stored_values_of_params_it_did_not_select(tmp_path):
    """A second ``-E existing --set-commit-hash`` run of the same commit selecting one param: asv keeps
    the others' stored values (the knobs made setup_cache measure that param only)."""
    cfg, env = _setup(tmp_path)
    head = _head()
    wide = _asv_run(cfg, env, head, r"\('torch-(fp8-ref|sdpa-bf16)', 's(128|256)'\)")
    assert wide.returncode == 0, (wide.stdout + wide.stderr)[-3000:]
    _, first = _stored(cfg, head)
    kept = [("torch-sdpa-bf16", "s128"), ("torch-sdpa-bf16", "s256"), ("torch-fp8-ref", "s256")]
    for key in kept + [("torch-fp8-ref", "s128")]:
        assert first[key] is not None and 0 < first[key] < 0.5, (key, first[key])
    narrow = _asv_run(cfg, env, head, ONE)
    assert narrow.returncode == 0, (narrow.stdout + narrow.stderr)[-3000:]
    _, second = _stored(cfg, head)
    for key in kept:  # not selected by the second run: the stored value, not n/a
        assert second[key] == first[key], (key, first[key], second[key])
    assert second[("torch-fp8-ref", "s128")] == first[("torch-fp8-ref", "s128")]  # same seed, deterministic
    assert second[("aiter", "s128")] != second[("aiter", "s128")]  # never measured: still n/a (NaN)


@pytest.mark.parametrize("knob,needle", [
    ({"MLA_FP8_BENCH_CASES": "s128,nope"}, "MLA_FP8_BENCH_CASES names cases ['nope']"),
    ({"MLA_FP8_BENCH_MAX_TOKENS": "abc"}, "MLA_FP8_BENCH_MAX_TOKENS='abc' is not an integer"),
    ({"MLA_FP8_BENCH_EXPECT_COMMIT": "0123456789abcdef"}, "MLA_FP8_BENCH_EXPECT_COMMIT=0123456789abcdef but"),
], ids=["unknown-case", "max-tokens-not-a-number", "other-commit"])
def test_a_bad_knob_or_other_code_never_replaces_stored_values(tmp_path, knob, needle):
    """A run with a bad knob, or whose code is not the commit named: refused while asv discovers the
    benchmarks, so the stored result file of the commit is byte-identical, not nulled."""
    cfg, env = _setup(tmp_path)
    head = _head()
    ok = _asv_run(cfg, env, head, ONE)
    assert ok.returncode == 0, (ok.stdout + ok.stderr)[-3000:]
    path, first = _stored(cfg, head)
    assert first[("torch-fp8-ref", "s128")] is not None
    before = path.read_bytes()
    bad = _asv_run(cfg, env, head, ONE, **knob)
    out = " ".join((bad.stdout + bad.stderr).split())
    assert bad.returncode != 0, out[-3000:]
    assert path.read_bytes() == before
    assert needle in out, out[-3000:]
