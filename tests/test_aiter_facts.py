"""AITER facts (``mla_fp8_bench.aiter_ps.facts``) and workspace sizes (``aiter_ps.workspace``) against the
documented values (docs/aiter-contract.md) and AITER's golden data."""

from __future__ import annotations

import gzip
import inspect
import json
import types
from pathlib import Path

import pytest

from mla_fp8_bench.aiter_ps import facts
from mla_fp8_bench.aiter_ps.workspace import vllm_padded_heads, vllm_reserved, workspace_bytes

DATA = Path(__file__).resolve().parent / "data"


@pytest.mark.parametrize("text, want", [
    ("0.1.20", (0, 1, 20)), ("v0.1.20.post1", (0, 1, 20)), ("0.1.7.post2.dev18", (0, 1, 7)),
    ("0.1.22+rocm7.0", (0, 1, 22)), ((0, 1, 22), (0, 1, 22)), ([0, 1, 16, 3], (0, 1, 16)),
])
def test_parse_version(text, want):
    assert facts.parse_aiter_version(text) == want


@pytest.mark.parametrize("bad", ["", "0.1", "latest", "0.1.x", "1..2", (0, 1), (0, "1", 2), (0, -1, 2), 7])
def test_parse_version_rejects(bad):
    with pytest.raises(ValueError, match="AITER version"):
        facts.parse_aiter_version(bad)
    assert facts.parse_aiter_version_or_none(bad) is None


def test_reduce_heads_by_version():
    base = {1, 2, 4, 8, 10, 16, 128}
    assert facts.reduce_heads_for("0.1.10") == base
    assert facts.reduce_heads_for("0.1.11") == base | {32, 64}
    assert facts.reduce_heads_for((0, 1, 12)) == base | {32, 64, 40}
    assert facts.reduce_heads_for("0.1.20.post1") == facts.reduce_heads_for(None) == base | {32, 64, 40, 48, 96}
    assert 80 not in facts.reduce_heads_for(None) and 112 not in facts.reduce_heads_for(None)  # vLLM pads to 16s


def test_reduce_arity():
    assert [facts.reduce_arity_for_version(v) for v in ("0.1.7", "0.1.8", "0.1.15", "0.1.16", "0.1.22")] == [
        7, 8, 8, 9, 9]



def _opaque(*args, **kwargs): ...


def _planner_markers(module):
    """Optional planner parameters ``module`` exposes: ``need_lse`` (the planner's op schema), ``max_kvlen`` /
    ``kvlen_granularity`` (the pure-Python info function's signature)."""
    params, _ = facts.op_params(module, "get_ps_metadata_v1")
    info = inspect.signature(module.get_ps_metadata_info_v1).parameters
    return {"max_kvlen": "max_kvlen" in info, "kvlen_granularity": "kvlen_granularity" in info,
            "need_lse": "need_lse" in (params or ())}


def _is_post_3606(x):
    """Whether a version or an ``aiter`` module has a planner that can give every tile a partial slot."""
    if isinstance(x, (str, tuple, list)):
        return facts.parse_aiter_version(x) >= facts.POST_3606_FIRST_VERSION
    det = facts.detect_planner_revision(x)
    if det.value is None:
        raise ValueError(det.source)
    return det.value != "pre-3606"


def test_detection_reads_registered_schemas_not_wrapper_signatures():
    """The stand-in hands out (*args, **kwargs) wrappers, as AITER does; the forms come from the op schemas."""
    from mla_fp8_bench.aiter_ps.standin import make_standin_aiter

    for variant in (7, 8, 9):
        mod = make_standin_aiter(reduce_variant=variant, aiter_version="0.1.20")
        assert str(inspect.signature(mod.mla_reduce_v1)) == "(*args, **kwargs)"
        det = facts.detect_reduce_arity(mod, "0.1.0")  # a source build's version: the schema wins
        assert det.value == variant and det.source == f"op schema {mod.aiter_op_namespace}::mla_reduce_v1"
    for version, rev in (("0.1.16", "pre-3606"), ("0.1.20.post1", "pre-3606"), ("0.1.22", "v0.1.22")):
        det = facts.detect_planner_revision(make_standin_aiter(aiter_version=version), "0.1.0")
        assert det.value == rev and det.source.startswith("op schema")
    ref = make_standin_aiter(aiter_version="0.1.20", planner_revision="pr3606-ref")
    assert facts.detect_planner_revision(ref).value == "pr3606-ref"
    assert _planner_markers(make_standin_aiter()) == {"max_kvlen": False, "kvlen_granularity": False,
                                                           "need_lse": True}


def test_detection_falls_back_to_the_version_then_names_what_is_missing():
    mod = types.SimpleNamespace(mla_reduce_v1=_opaque, get_ps_metadata_v1=_opaque, aiter_op_namespace="no_such_ns")
    det = facts.detect_reduce_arity(mod, "0.1.20")
    assert det.value == 9 and det.source.startswith("facts table at AITER 0.1.20 (no registered op")
    assert facts.detect_planner_revision(mod, (0, 1, 22)).value == "v0.1.22"
    det = facts.detect_reduce_arity(mod, None)
    assert det.value is None and "no registered op no_such_ns::mla_reduce_v1" in det.source
    assert "no readable AITER version" in det.source
    with pytest.raises(ValueError, match="the planner revision cannot be told"):
        _is_post_3606(mod)


def test_effective_version_from_features():
    """A source build reports 0.1.0: the detected features raise the version the head sets are keyed on."""
    assert facts.effective_version((0, 1, 0), 9, "pre-3606") == (0, 1, 16)
    assert facts.effective_version((0, 1, 0), 9, "v0.1.22") == (0, 1, 22)
    assert facts.effective_version((0, 1, 20), 9, "pre-3606") == (0, 1, 20)
    assert facts.effective_version(None, None, None) is None
    assert 32 in facts.reduce_heads_for(facts.effective_version((0, 1, 0), 9, "pre-3606"))


def test_post_3606_by_version_and_marker():
    assert facts.POST_3606_FIRST_VERSION == (0, 1, 22)
    assert not _is_post_3606("0.1.21") and _is_post_3606("0.1.22") and _is_post_3606((0, 2, 0))
    assert facts.planner_revision_for("0.1.21") == "pre-3606"
    assert facts.planner_revision_for("0.1.22.post1") == "v0.1.22"


def test_work_info_layout_matches_aiter_data():
    with gzip.open(DATA / "ps_planner_golden_v2_post3606.json.gz", "rt") as f:
        meta = json.load(f)["meta"]
    assert tuple(meta["work_info_fields"]) == facts.WORK_INFO_FIELDS
    assert facts.pack_q_head_range(5, 6) == 5 | (6 << 16)
    assert facts.unpack_q_head_range(facts.pack_q_head_range(127, 128)) == (127, 128)
    assert (facts.Q_TILE, facts.KV_TILE, facts.KVLEN_GRANULARITY) == (256, 128, 128)


def test_dist_version_missing():
    assert facts.dist_version("no-such-distribution-mla-fp8-bench") is None


def test_workspace_bytes():
    # B=16 x 16384, H=16: 1,920 slots (pre-#3606 bound) -> ~4.07 GB; 147,456 (post) -> ~311.7 GB
    pre = workspace_bytes(1920, 16 * 16384, 16)
    assert (pre.partial_output, pre.partial_lse, pre.final_lse) == (4_026_531_840, 31_457_280, 16_777_216)
    assert workspace_bytes(147456, 16 * 16384, 16).total == 311_670_341_632
    # vLLM rounds each slice to 256 bytes
    assert workspace_bytes(0, 3, 1, align=256).final_lse == 256


def test_vllm_reservation():
    # vLLM >= 0.31: 8192 tokens, 1024 seqs, 256 CUs -> 1311 tiles (vLLM's own example)
    kw = dict(info_partial_slots=9, max_num_batched_tokens=8192, max_num_reqs=1024, num_compute_units=256,
              pads_heads=True, num_heads=16, num_head_k=16)
    assert vllm_reserved(budget_sizing=True, **kw)[0] == 1311 and vllm_reserved(budget_sizing=False, **kw)[0] == 9
    assert [vllm_padded_heads(h) for h in (8, 12, 16, 24, 128)] == [16, 16, 16, 32, 128]
    gib = workspace_bytes(1311, 8192, 16).partial_output / 2**30
    assert 2.55 < gib < 2.57  # "about 2.56 GiB of logits"


def test_vllm_reserved_bytes_by_hand():
    # 8192 tokens / 256 + 4 seqs - 1 + 256 CUs = 291 slots = 74,496 rows, at 16 padded heads, dv 128, fp32
    kw = dict(budget_sizing=True, info_partial_slots=9, max_num_batched_tokens=8192, max_num_reqs=4,
              num_compute_units=256, num_head_k=16)
    p, wb = vllm_reserved(pads_heads=True, num_heads=8, **kw)
    assert p == 291
    assert (wb.partial_output, wb.partial_lse, wb.final_lse) == (610_271_232, 4_767_744, 524_288)
    assert wb.extra == 8192 * 16 * 128 * 2  # bf16 output scratch for the 8 padded heads
    assert vllm_reserved(pads_heads=False, num_heads=8, **kw)[1].extra == 0  # vLLM < 0.29 does not pad
    assert vllm_reserved(pads_heads=True, num_heads=16, **kw)[1].extra == 0  # nothing to pad


def test_contract_anchors_referenced_in_the_repo_exist():
    """Every ``docs/aiter-contract.md#<anchor>`` named in the package, tests or docs exists in the doc."""
    import re

    root = Path(__file__).resolve().parents[1]
    doc = (root / "docs" / "aiter-contract.md").read_text()
    anchors = set(re.findall(r'<a id="([a-z0-9-]+)"></a>', doc))
    assert {"planner-io", "work-info", "info-sizes", "pr-3606", "kernel", "reduce", "standin", "vllm-entry",
            "workspace", "versions"} <= anchors
    files = [*root.glob("mla_fp8_bench/**/*.py"), *root.glob("tests/*.py"), *root.glob("docs/*.md"),
             root / "README.md"]
    used = {(f.name, a) for f in files for a in re.findall(r"aiter-contract\.md#([a-z0-9-]+)", f.read_text())}
    used |= {("aiter-contract.md", a) for a in re.findall(r"\]\(#([a-z0-9-]+)\)", doc)}
    missing = sorted((f, a) for f, a in used if a not in anchors)
    assert not missing, f"references to missing anchors: {missing}"
