"""The real-AITER tier: the shipped ``aiter`` backend and the ``vllm-aiter`` adapter driven through AITER's
own Python layer (``compile_ops`` / ``torch_compile_guard`` wrappers) at every revision in ``AITER_SRC_DIR``,
the compiled modules bound to the emulation (``real_layer.py``).

Per revision, in a process of its own (``drive_aiter.py``): the backend is available, reads the reduce form
and the planner revision from the registered op schemas (AITER's wrappers are ``(*args, **kwargs)``), runs
prefill, ragged, ctx and prefix cases bit for bit like the direct emulation, shows the ``lse-gap`` bug
before #3606 and not at the PR ref, and ``mla-fp8-bench env`` names what it detected and where. Per
revision and vLLM release (``drive_vllm.py --aiter-root``, in the vLLM tier's envs): vLLM's real
``_mla_fp8_prefill_attn`` runs on it and equals ``aiter-emulated``; below v0.1.16 (8-argument reduce) the
adapter refuses with vLLM's own requirement.

Skipped unless requested (``conftest.py``); without ``AITER_SRC_DIR`` every test skips with the reason. Writes
only under pytest's temporary directories; never reaches the network.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mla_fp8_bench.problem.cases import parse_case_id

pytestmark = pytest.mark.aiter

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SRC_ENV = "AITER_SRC_DIR"
TIMEOUT_S = 300


def _vllm_envs_dir() -> Path:
    """Where ``scripts/vllm_envs.sh`` keeps the vLLM envs (it alone defines the default)."""
    out = subprocess.run(["bash", str(REPO / "scripts" / "vllm_envs.sh"), "--print-dir"], capture_output=True,
                         text=True, check=True).stdout.strip()
    return Path(out)


VLLM_ENVS_DIR = _vllm_envs_dir()
VLLM_VERSIONS = os.environ.get("VLLM_TIER_VERSIONS", "0.28.0 0.33.0").split()
VLLM_CASES = ("s128-cast", "s257-cast", "ragged-255-1-300-257-cast", "s300-h24-cast", "s512-h12-cast")
#: facts of the five archived revisions, read in AITER's sources at those revisions
KNOWN = {"v0.1.10.post1": (8, "pre-3606", "pybind"), "v0.1.16": (9, "pre-3606", "ctypes"),
         "v0.1.20.post1": (9, "pre-3606", "ctypes"), "main-2026-08-22": (9, "pre-3606", "ctypes"),
         "pr3606-2026-08-22": (9, "pr3606-ref", "ctypes")}
#: Serving head counts (8, 12, 16, 24, 32, 64) mla_reduce_v1 dispatches at v_head_dim 128, by the release the
#: binding emulates (AITER's reduce dispatch: 32 and 64 from v0.1.11; never 12 or 24)
SERVING_OK = {"0.1.10": [8, 16], "0.1.16": [8, 16, 32, 64], "0.1.20": [8, 16, 32, 64]}

sys.path.insert(0, str(HERE))
import real_layer  # noqa: E402


def _src_dir() -> Path | None:
    raw = os.environ.get(SRC_ENV, "")
    return Path(raw) if raw and Path(raw).is_dir() else None


def _names() -> list[str]:
    src = _src_dir()
    if src is None:
        return ["(none)"]
    names = [p.name[len("aiter-"):-len(".tar.gz")] for p in src.iterdir()
             if p.is_file() and p.name.startswith("aiter-") and p.name.endswith(".tar.gz")]
    names += [p.name.removeprefix("aiter-") for p in src.iterdir()
              if p.is_dir() and (p / "aiter" / "ops" / "attention.py").is_file()]
    return sorted(names) or ["(none)"]


@pytest.fixture(scope="session")
def trees(tmp_path_factory) -> dict[str, Path]:
    src = _src_dir()
    if src is None:
        pytest.skip(f"{SRC_ENV} is not set to a directory of AITER sources (aiter-<name>.tar.gz archives or "
                    "`git clone https://github.com/ROCm/aiter` checkouts, one per revision): docs/cpu-tiers.md")
    found = real_layer.source_trees(src, tmp_path_factory.mktemp("aiter-src"))
    if not found:
        pytest.skip(f"{SRC_ENV}={src} holds no AITER source tree (aiter/ops/attention.py)")
    return found


def _version(name: str, root: Path) -> tuple[str, str]:
    """``(release emulated by the binding, aiter-emulated version to compare with)`` for a revision: its
    version when the name is one, else 0.1.20 (the last release before #3606); compared with 0.1.22 when
    its planner can give every tile a slot."""
    from mla_fp8_bench.aiter_ps.facts import format_version, parse_aiter_version_or_none

    ver = parse_aiter_version_or_none(name)
    release = format_version(ver) if ver is not None else "0.1.20"
    rev = real_layer.revision_of(root)[0]
    return release, ("0.1.22" if rev != "pre-3606" else release)


_REPORTS: dict[str, dict] = {}


@pytest.fixture(scope="module", params=_names())
def report(request, trees, tmp_path_factory) -> dict:
    name = request.param
    if name not in trees:
        pytest.skip(f"no AITER source tree {name!r} in {SRC_ENV}")
    if name not in _REPORTS:
        root = trees[name]
        work = tmp_path_factory.mktemp(f"run-{name}")
        release, direct = _version(name, root)
        out = work / "report.json"
        env = dict(os.environ, PYTHONPATH=str(REPO))
        proc = subprocess.run([sys.executable, str(HERE / "drive_aiter.py"), "--root", str(root), "--version", release,
                               "--direct-version", direct, "--work", str(work / "scratch"), "--out", str(out)],
                              cwd=str(REPO), env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        assert proc.returncode == 0 and out.exists(), f"{name}: driver rc {proc.returncode}\n{proc.stderr[-4000:]}"
        rep = json.loads(out.read_text())
        rep["name"], rep["release"] = name, release
        _REPORTS[name] = rep
    return _REPORTS[name]


def test_aiter_backend_is_available_through_aiters_own_wrappers(report):
    assert report["available"], f"{report['name']}: {report['reason']}"
    assert report["wrapper_module"] == "torch_guard"  # the object handed out is AITER's torch_compile_guard wrapper
    assert not report["errors"], report["errors"]


def test_forms_are_read_from_the_registered_op_schemas(report):
    """Not from the version (the layer reports 0.1.0, as a source build without git metadata does)."""
    det, layer = report["detection"], report["layer"]
    arity, rev, binding = KNOWN.get(report["name"], (layer["reduce_arity"], layer["planner_revision"],
                                                     layer["kernel_binding"]))
    assert det["mla_reduce_v1"] == f"{arity}-argument form (op schema aiter::mla_reduce_v1)"
    assert det["get_ps_metadata_v1"].startswith(f"{rev} planner (op schema aiter::get_ps_metadata_v1")
    ok = SERVING_OK[report["release"]]  # probed through AITER's wrappers, not read from the 0.1.0 it reports
    assert det["reduce heads"] == f"{ok} of the serving counts [8, 12, 16, 24, 32, 64] (probed on cpu; AITER " \
                                  "reports 0.1.0)", det
    assert layer["kernel_binding"] == binding


def test_every_case_equals_the_direct_emulation_bit_for_bit(report):
    cases = report["cases"]
    assert len(cases) >= 9, cases
    for cid, c in cases.items():  # 32 and 64 heads reach the reduce's dispatch only from v0.1.11; 12 never
        heads = parse_case_id(cid).num_heads
        refused = heads in (8, 12, 16, 24, 32, 64) and heads not in SERVING_OK[report["release"]]
        assert c["supported"] is not refused, c
        assert not refused or "dispatches num_heads in" in c["reason"] and f"got {heads}:" in c["reason"], c
    cases = {cid: c for cid, c in cases.items() if c["supported"]}
    families = {cid.split("-")[0].rstrip("0123456789") for cid in cases}
    assert {"s", "ragged", "ctx", "prefix"} <= families
    bad = {cid: c for cid, c in cases.items() if not (c["equal_out"] and c["equal_lse"])}
    assert not bad, f"{report['name']}: differs from aiter-emulated {bad}"
    assert all(c["timing_scope"] == "emulation" for c in cases.values())  # never reported as a kernel's time


def test_lse_gap_shows_before_3606_and_not_at_the_pr_ref(report):
    gap = report["lse_gap"]
    if report["layer"]["planner_revision"] == "pre-3606":
        assert all(r["lse_nonfinite_count"] > 0 for r in gap.values()), gap  # unsplit tiles: no final_lse
        assert gap["prefix256-q100"]["status"] == "error"
    else:
        assert all(r["status"] == "ok" and r["lse_nonfinite_count"] == 0 for r in gap.values()), gap


def test_env_names_the_detected_reduce_form_and_its_source(report):
    text = " ".join(report["env"].split())
    assert "detected on the installed library" in text
    assert "mla_reduce_v1" in text and "-argument form (op schema aiter::mla_reduce_v1)" in text.replace("│ ", "")


# ----------------------------------------------------------------------------------------------
# vllm-aiter on vLLM's real code, through the real layer


@pytest.mark.parametrize("vllm_ver", VLLM_VERSIONS)
@pytest.mark.parametrize("name", _names())
def test_vllm_aiter_through_the_real_layer(name, vllm_ver, trees, tmp_path):
    if name not in trees:
        pytest.skip(f"no AITER source tree {name!r} in {SRC_ENV}")
    py = VLLM_ENVS_DIR / f"vllm-{vllm_ver}" / "bin" / "python"
    if not py.exists() or not (VLLM_ENVS_DIR / f"vllm-{vllm_ver}" / ".vllm-tier-ok").exists():
        pytest.skip(f"no healthy vLLM {vllm_ver} env at {VLLM_ENVS_DIR}: create it with "
                    f"`bash {REPO / 'scripts' / 'vllm_envs.sh'}`")
    release, _ = _version(name, trees[name])
    out = tmp_path / "vllm.json"
    env = dict(os.environ, PYTHONPATH=str(REPO), VLLM_TARGET_DEVICE="cpu")
    proc = subprocess.run([str(py), str(REPO / "tests" / "vllm_tier" / "drive_vllm.py"), "--repo", str(REPO),
                           "--out", str(out), "--cases", *VLLM_CASES, "--aiter-root", str(trees[name]),
                           "--aiter-version", release, "--work", str(tmp_path / "scratch")],
                          cwd=str(REPO), env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0 and out.exists(), f"rc {proc.returncode}\n{proc.stderr[-4000:]}"
    rep = json.loads(out.read_text())
    assert rep["vllm"] == vllm_ver
    cases = {k: v for k, v in rep["errors"].items() if k.startswith("case:")}
    if real_layer.revision_of(trees[name])[1] < 9:
        assert "vLLM needs aiter >= v0.1.16" in rep["availability"], rep["availability"]
        return
    assert rep["availability"] == "yes", rep["availability"]
    assert not cases, cases
    ran = [c for c in rep["cases"].values() if c.get("supported")]
    assert ran and all(c["reduce_ints"] == [256, 0] for c in ran)  # the 9-argument call reached the binding
    assert rep["fp8_path"]["taken"] is True, rep["fp8_path"]
