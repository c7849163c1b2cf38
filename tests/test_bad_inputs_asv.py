"""Bad-input catalogue, asv runs (docs/robustness.md section J): real asv 0.6.6 runs in a temporary
results directory. A run that measures part of the grid never turns stored values into n/a; a run
that cannot know which stored file it overwrites is refused before asv writes anything.
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
    env.update(HOME=str(tmp_path), MLA_FP8_BENCH_TIME_BUDGET="0.2", MLA_FP8_BENCH_SAMPLES="2",
               MLA_FP8_BENCH_DEVICE="cpu")
    subprocess.run([str(ASV), "machine", "--yes", "--machine", "pytest-cpu"], cwd=cfg.parent, env=env, check=True,
                   capture_output=True)
    return cfg, env


def _asv_run(cfg: Path, env: dict[str, str], head: str, **narrow: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(ASV), "run", "--config", str(cfg), "--machine", "pytest-cpu", "-E", f"existing:{sys.executable}",
         "--set-commit-hash", head, "--quick", "-b", r"MLAPrefill\.track_max_abs_error(?!_)"],
        cwd=cfg.parent, env=dict(env, **narrow), capture_output=True, text=True, timeout=600)


def _stored(cfg: Path, head: str) -> tuple[Path, dict[tuple[str, str], float | None]]:
    (path,) = (cfg.parent / "results" / "pytest-cpu").glob(f"{head[:8]}-*.json")
    doc = json.loads(path.read_text())
    row = dict(zip(doc["result_columns"], doc["results"][BENCH]))
    backends, cases = ([json.loads(x.replace("'", '"')) for x in p] for p in row["params"])
    vals = iter(row["result"])
    return path, {(b, c): next(vals) for b in backends for c in cases}


def test_narrower_asv_run_keeps_the_stored_values_of_params_it_did_not_measure(tmp_path):
    """Issue row 2: a second `-E existing --set-commit-hash` run with fewer backends and a lower token cap."""
    cfg, env = _setup(tmp_path)
    head = _head()
    wide = _asv_run(cfg, env, head, MLA_FP8_BENCH_BACKENDS="torch-fp8-ref,torch-sdpa-bf16",
                    MLA_FP8_BENCH_MAX_TOKENS="256")
    assert wide.returncode == 0, (wide.stdout + wide.stderr)[-3000:]
    _, first = _stored(cfg, head)
    kept = [("torch-sdpa-bf16", "s128"), ("torch-sdpa-bf16", "s256"), ("torch-fp8-ref", "s256")]
    for key in kept + [("torch-fp8-ref", "s128")]:
        assert first[key] is not None and 0 < first[key] < 0.5, (key, first[key])
    narrow = _asv_run(cfg, env, head, MLA_FP8_BENCH_BACKENDS="torch-fp8-ref", MLA_FP8_BENCH_MAX_TOKENS="128")
    assert narrow.returncode == 0, (narrow.stdout + narrow.stderr)[-3000:]
    _, second = _stored(cfg, head)
    for key in kept:  # not measured by the narrow run: the stored value, not n/a
        assert second[key] == first[key], (key, first[key], second[key])
    assert second[("torch-fp8-ref", "s128")] == first[("torch-fp8-ref", "s128")]  # same seed, deterministic
    assert second[("aiter", "s128")] != second[("aiter", "s128")]  # never measured: still n/a (NaN)


def test_narrowed_run_over_a_truncated_stored_file_is_refused_before_asv_writes(tmp_path):
    cfg, env = _setup(tmp_path)
    head = _head()
    ok = _asv_run(cfg, env, head, MLA_FP8_BENCH_BACKENDS="torch-fp8-ref", MLA_FP8_BENCH_MAX_TOKENS="128")
    assert ok.returncode == 0, (ok.stdout + ok.stderr)[-3000:]
    path, _ = _stored(cfg, head)
    path.write_bytes(path.read_bytes()[:200])  # a kill during asv's own (non-atomic) write
    before = path.read_bytes()
    refused = _asv_run(cfg, env, head, MLA_FP8_BENCH_BACKENDS="torch-sdpa-bf16", MLA_FP8_BENCH_MAX_TOKENS="128")
    out = " ".join((refused.stdout + refused.stderr).split())
    assert refused.returncode != 0
    assert f"stored asv result file {path} cannot be read" in out, out[-3000:]
    assert path.read_bytes() == before


def _checkout_head() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.mark.parametrize("knob,needle", [
    ({"MLA_FP8_BENCH_CASES": "s128,nope"}, "MLA_FP8_BENCH_CASES names cases ['nope']"),
    ({"MLA_FP8_BENCH_MAX_TOKENS": "abc"}, "MLA_FP8_BENCH_MAX_TOKENS='abc' is not an integer"),
    ({"MLA_FP8_BENCH_BACKENDS": "torch-fp8-ref", "MLA_FP8_BENCH_MACHINE": "another-box"},
     "MLA_FP8_BENCH_MACHINE=another-box but asv run --machine pytest-cpu"),
    ({"MLA_FP8_BENCH_BACKENDS": "torch-fp8-ref", "MLA_FP8_BENCH_EXPECT_COMMIT": "CHECKOUT"},
     "but asv run --set-commit-hash"),
], ids=["unknown-case", "max-tokens-not-a-number", "machine-override-contradicts", "commit-override-contradicts"])
def test_a_bad_knob_or_contradicting_override_never_replaces_stored_values(tmp_path, knob, needle):
    """A narrowed `-E existing` run with a bad knob: refused while asv discovers the benchmarks, so the
    stored result file of the commit is byte-identical, not nulled."""
    cfg, env = _setup(tmp_path)
    head = _head()
    ok = _asv_run(cfg, env, head, MLA_FP8_BENCH_BACKENDS="torch-fp8-ref", MLA_FP8_BENCH_MAX_TOKENS="128")
    assert ok.returncode == 0, (ok.stdout + ok.stderr)[-3000:]
    path, first = _stored(cfg, head)
    assert first[("torch-fp8-ref", "s128")] is not None
    before = path.read_bytes()
    knob = {k: (_checkout_head() if v == "CHECKOUT" else v) for k, v in knob.items()}
    bad = _asv_run(cfg, env, head, **{"MLA_FP8_BENCH_MAX_TOKENS": "128", **knob})
    out = " ".join((bad.stdout + bad.stderr).split())
    assert bad.returncode != 0, out[-3000:]
    assert path.read_bytes() == before
    assert needle in out, out[-3000:]
