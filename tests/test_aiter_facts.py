"""AITER facts (``mla_fp8_bench.aiter_ps.facts``) and workspace sizes (``aiter_ps.workspace``) against the
documented values (docs/aiter-contract.md) and AITER's golden data."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from mla_fp8_bench.aiter_ps import facts
from mla_fp8_bench.aiter_ps.workspace import vllm_padded_heads, vllm_partial_tiles, workspace_bytes

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

    def r7(partial_output, partial_lse, reduce_indptr, reduce_final_map, reduce_partial_map, final_output,
           final_lse=None): ...

    def r8(partial_output, partial_lse, reduce_indptr, reduce_final_map, reduce_partial_map, max_seqlen_q,
           final_output, final_lse=None): ...

    def r9(partial_output, partial_lse, reduce_indptr, reduce_final_map, reduce_partial_map, max_seqlen_q,
           num_kv_splits, final_output, final_lse=None): ...

    assert [facts.detect_reduce_arity(f) for f in (r7, r8, r9)] == [7, 8, 9]


def _info_pre(batch_size, num_head_k, max_qlen, qlen_granularity=256): ...


def _info_post(batch_size, num_head_k, max_qlen, qlen_granularity=256, max_kvlen=None, kvlen_granularity=128): ...


def _plan_need_lse(seqlens_qo_indptr, pages_kv_indptr, context_lens, need_lse=False): ...


def test_post_3606_by_version_and_marker():
    assert facts.POST_3606_FIRST_VERSION == (0, 1, 22)
    assert not facts.is_post_3606("0.1.21") and facts.is_post_3606("0.1.22") and facts.is_post_3606((0, 2, 0))
    assert facts.is_post_3606(_info_post) and not facts.is_post_3606(_info_pre)

    class Mod:  # an aiter-like object
        get_ps_metadata_info_v1 = staticmethod(_info_pre)
        get_ps_metadata_v1 = staticmethod(_plan_need_lse)

    assert not facts.is_post_3606(Mod)  # need_lse is not the #3606 marker
    assert facts.planner_markers(Mod) == {"max_kvlen": False, "kvlen_granularity": False, "need_lse": True}
    with pytest.raises(ValueError, match="no get_ps_metadata_info_v1"):
        facts.is_post_3606(object())


def test_work_info_layout_matches_aiter_data():
    with gzip.open(DATA / "ps_planner_golden_v2_post3606.json.gz", "rt") as f:
        meta = json.load(f)["meta"]
    assert tuple(meta["work_info_fields"]) == facts.WORK_INFO_FIELDS
    assert (facts.WI.BATCH_IDX, facts.WI.PARTIAL_O_LOC, facts.WI.Q_HEAD_RANGE) == (0, 1, 7)
    assert facts.pack_q_head_range(5, 6) == 5 | (6 << 16)
    assert facts.unpack_q_head_range(facts.pack_q_head_range(127, 128)) == (127, 128)
    assert (facts.Q_TILE, facts.KV_TILE, facts.KVLEN_GRANULARITY, facts.kvlen_granularity_for(256)) == (
        256, 128, 128, 256)


def test_dist_version_missing():
    assert facts.dist_version("no-such-distribution-mla-fp8-bench") is None


def test_workspace_bytes():
    # B=16 x 16384, H=16: 1,920 slots (pre-#3606 bound) -> ~4.07 GB; 147,456 (post) -> ~311.7 GB
    pre = workspace_bytes(1920, 16 * 16384, 16)
    assert (pre.partial_output, pre.partial_lse, pre.final_lse) == (4_026_531_840, 31_457_280, 16_777_216)
    assert workspace_bytes(147456, 16 * 16384, 16).total == 311_670_341_632
    # vLLM rounds each slice to 256 bytes
    assert workspace_bytes(0, 3, 1, align=256).final_lse == 256
    with pytest.raises(ValueError, match="num_heads=0"):
        workspace_bytes(1, 1, 0)


def test_vllm_reservation():
    # vLLM >= 0.31: 8192 tokens, 1024 seqs, 256 CUs -> 1311 tiles (vLLM's own example)
    assert vllm_partial_tiles(budget_sizing=True, info_partial_slots=9, max_num_batched_tokens=8192,
                              max_num_reqs=1024, num_compute_units=256) == 1311
    assert vllm_partial_tiles(budget_sizing=False, info_partial_slots=9, max_num_batched_tokens=8192,
                              max_num_reqs=1024, num_compute_units=256) == 9
    assert [vllm_padded_heads(h) for h in (8, 12, 16, 24, 128)] == [16, 16, 16, 32, 128]
    gib = workspace_bytes(1311, 8192, 16).partial_output / 2**30
    assert 2.55 < gib < 2.57  # "about 2.56 GiB of logits"


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
