"""CPU contract tests of the ``vllm-aiter`` adapter (no vLLM install needed).

Small stand-in vLLM modules (``rocm_aiter_mla`` + ``workspace``), one per documented release family,
expose exactly the documented method signatures and behaviour (docs/aiter-contract.md#vllm-entry;
written from the doc, not from vLLM's source):

* 0.28: ``_init_fp8_prefill_ps_buffers(max_num_reqs, max_prefill_qlen, max_num_batched_tokens,
  device)``, no padding (``% 16`` gate), scratch sized from AITER's loose bound, blocking plan write
  + ``.item()``;
* 0.29: ``attn_out_dtype`` added, pad-to-16 heads + padded-output scratch;
* 0.31: budget-aware scratch (``num_compute_units``);
* 0.32: plans built into 2-slot host staging and copied;
* 0.33: the unit scale cached in ``_fp8_prefill_one_scale``.

Every stand-in hands the real work to the stand-in ``aiter`` (planner port + emulator), so the
adapter's output must equal ``aiter-emulated``'s bit for bit. vLLM's real classes are exercised by
the separate tier in ``tests/vllm_tier`` (``-m vllm``).
"""

from __future__ import annotations

import functools
import math
import sys
import types
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from mla_fp8_bench.aiter_ps.standin import StandinContractError, make_standin_aiter
from mla_fp8_bench.aiter_ps.workspace import vllm_reserved
from mla_fp8_bench.backends import get_backend
from mla_fp8_bench.backends.aiter_emulated import AiterEmulated
from mla_fp8_bench.backends.vllm_aiter import (
    VllmAdapterError,
    VllmAiter,
    VllmFeatures,
    detect_features,
)
from mla_fp8_bench.harness.runner import CaseData, RunOptions, evaluate_one
from mla_fp8_bench.measure.devices import PlatformInfo
from mla_fp8_bench.problem.cases import parse_case_id
from mla_fp8_bench.problem.fp8 import quantize
from mla_fp8_bench.problem.inputs import make_inputs

from support.vllm_faults import ADAPTER_FAULTS, FaultyVllmAiter, for_testing

CU = 32  # a small CU count keeps the emulator fast; the tier uses MI355X's 256
TILE = 256
VERSIONS = ("0.28", "0.29", "0.31", "0.32", "0.33")

# ------------------------------------------------------------------------------------------------
# stand-in vLLM modules


def _make_workspace_module(name: str) -> types.ModuleType:
    ws = types.ModuleType(name)
    state = {"manager": None}

    class Manager:
        def __init__(self, device):
            self._device = device
            self._current_workspaces = [None]
            self._locked = False

        def lock(self):
            self._locked = True

        def is_locked(self):
            return self._locked

        def get_simultaneous(self, *specs):
            sizes = [math.prod(s) * d.itemsize for s, d in specs]
            aligned = [(n + 255) // 256 * 256 for n in sizes]
            buf = self._current_workspaces[0]
            have = 0 if buf is None else buf.numel()
            if have < sum(aligned):
                if self._locked:
                    raise AssertionError(f"Workspace is locked but allocation requires {sum(aligned) / 2**20:.2f} MB, "
                                         f"current size is {have / 2**20:.2f} MB")
                buf = self._current_workspaces[0] = torch.empty(sum(aligned), dtype=torch.uint8, device=self._device)
            out, off = [], 0
            for (shape, dtype), n, a in zip(specs, sizes, aligned):
                out.append(buf[off:off + n].view(dtype).reshape(shape))
                off += a
            return out

    def init_workspace_manager(device):
        state["manager"] = Manager(device)

    def current_workspace_manager():
        assert state["manager"] is not None, "WorkspaceManager not initialized"
        return state["manager"]

    def lock_workspace():
        current_workspace_manager().lock()

    def reset_workspace_manager():
        state["manager"] = None

    def is_workspace_manager_initialized():
        return state["manager"] is not None

    for fn in (init_workspace_manager, current_workspace_manager, lock_workspace, reset_workspace_manager,
               is_workspace_manager_initialized):
        setattr(ws, fn.__name__, fn)
    return ws


def _make_vllm_module(version: str, name: str, ws: types.ModuleType, cu_num: int) -> types.ModuleType:
    """A ``rocm_aiter_mla`` stand-in of one release family (see module docstring)."""
    v = tuple(int(x) for x in version.split("."))
    pads, budget, staged, cached = v >= (0, 29), v >= (0, 31), v >= (0, 32), v >= (0, 33)
    mod = types.ModuleType(name)
    platform = SimpleNamespace(num_compute_units=lambda: cu_num, fp8_dtype=lambda: torch.float8_e4m3fn)

    class AiterMLAHelper:
        @staticmethod
        def is_valid_num_heads(n):
            return n > 0 and (n <= 128 or n % 16 == 0)

    if pads:
        AiterMLAHelper.get_fp8_prefill_num_heads = staticmethod(lambda n: -(-n // 16) * 16)

    def heads_k(n):
        return AiterMLAHelper.get_fp8_prefill_num_heads(n) if pads else n

    class AiterMLAMetadataBuilder:
        def _alloc(self, max_num_reqs, max_prefill_qlen, device):
            from aiter import get_ps_metadata_info_v1

            info = get_ps_metadata_info_v1(batch_size=max_num_reqs, num_head_k=heads_k(self.num_heads),
                                           max_qlen=max_prefill_qlen, qlen_granularity=TILE)
            names = ("fp8_ps_work_metadata", "fp8_ps_work_indptr", "fp8_ps_work_info", "fp8_ps_reduce_indptr",
                     "fp8_ps_reduce_final_map", "fp8_ps_reduce_partial_map")
            for n, (shape, dtype) in zip(names, info):
                setattr(self, n, torch.empty(shape, dtype=dtype, device=device))
            size = info[5][0]  # real AITER gives 1-D sizes as bare ints
            return heads_k(self.num_heads), size if isinstance(size, int) else math.prod(size)

        def _reserve(self, p, h, tokens, out_dtype):
            specs = [((p * TILE, h, self.mla_dims.v_head_dim), torch.float32), ((p * TILE, h), torch.float32),
                     ((tokens, h), torch.float32)]
            if out_dtype is not None and self.num_heads < h:
                specs.append(((tokens, h, self.mla_dims.v_head_dim), out_dtype))
            ws.current_workspace_manager().get_simultaneous(*specs)

        def _outputs(self):
            return (self.fp8_ps_work_indptr, self.fp8_ps_work_info, self.fp8_ps_reduce_indptr,
                    self.fp8_ps_reduce_final_map, self.fp8_ps_reduce_partial_map)

        def _plan(self, metadata, common, outs):
            from aiter import get_ps_metadata_v1

            qsl = common.query_start_loc_cpu
            qo = (qsl[metadata.num_decodes:] - qsl[metadata.num_decodes]).to(torch.int32)
            get_ps_metadata_v1(qo, qo.clone(), (qo[1:] - qo[:-1]).to(torch.int32), 1, heads_k(self.num_heads),
                               self.fp8_ps_work_metadata, *outs, qhead_granularity=1, qlen_granularity=TILE,
                               kvlen_granularity=128, block_size=1, is_causal=True)
            return int(qo[-1])

        def _attach(self, metadata, total, n_partials):
            p = metadata.prefill
            metadata.fp8_prefill_qo_indptr = metadata.fp8_prefill_kv_indptr = p.query_start_loc
            metadata.fp8_prefill_kv_indices = torch.arange(total, dtype=torch.int32, device=p.query_start_loc.device)
            metadata.fp8_prefill_work_indptr = self.fp8_ps_work_indptr
            metadata.fp8_prefill_work_info_set = self.fp8_ps_work_info
            metadata.fp8_prefill_reduce_indptr = self.fp8_ps_reduce_indptr
            metadata.fp8_prefill_reduce_final_map = self.fp8_ps_reduce_final_map
            metadata.fp8_prefill_reduce_partial_map = self.fp8_ps_reduce_partial_map
            metadata.fp8_prefill_max_q_len = p.max_query_len
            metadata.fp8_prefill_num_partial_tiles = n_partials

        def _build_direct(self, metadata, common_attn_metadata):
            total = self._plan(metadata, common_attn_metadata, self._outputs())
            self._attach(metadata, total, int(self.fp8_ps_reduce_indptr[-1].item()))

        def _build_staged(self, metadata, common_attn_metadata):
            slot = self._fp8_ps_slot
            self._fp8_ps_slot ^= 1
            self._fp8_ps_staging_free[slot].synchronize()
            host = self._fp8_ps_staging[slot]
            total = self._plan(metadata, common_attn_metadata, host)
            for dst, src in zip(self._outputs(), host):
                dst.copy_(src, non_blocking=True)
            self._fp8_ps_staging_free[slot].record()
            self._attach(metadata, total, int(host[2][-1]))

    def init_028(self, max_num_reqs, max_prefill_qlen, max_num_batched_tokens, device):
        h, loose = self._alloc(max_num_reqs, max_prefill_qlen, device)
        self._reserve(loose, h, max_num_batched_tokens, None)

    def init_029(self, max_num_reqs, max_prefill_qlen, max_num_batched_tokens, attn_out_dtype, device):
        h, loose = self._alloc(max_num_reqs, max_prefill_qlen, device)
        self._reserve(loose, h, max_num_batched_tokens, attn_out_dtype)

    def init_031(self, max_num_reqs, max_prefill_qlen, max_num_batched_tokens, attn_out_dtype, device):
        h, _ = self._alloc(max_num_reqs, max_prefill_qlen, device)
        p = -(-max_num_batched_tokens // TILE) + max_num_reqs - 1 + platform.num_compute_units()
        self._reserve(p, h, max_num_batched_tokens, attn_out_dtype)

    def init_032(self, max_num_reqs, max_prefill_qlen, max_num_batched_tokens, attn_out_dtype, device):
        h, _ = self._alloc(max_num_reqs, max_prefill_qlen, device)
        self._fp8_ps_staging = [tuple(torch.empty_like(t, device="cpu") for t in self._outputs()) for _ in range(2)]
        self._fp8_ps_staging_free = [SimpleNamespace(record=lambda: None, synchronize=lambda: None)] * 2
        self._fp8_ps_slot = 0
        p = -(-max_num_batched_tokens // TILE) + max_num_reqs - 1 + platform.num_compute_units()
        self._reserve(p, h, max_num_batched_tokens, attn_out_dtype)

    init = init_032 if staged else init_031 if budget else init_029 if pads else init_028
    AiterMLAMetadataBuilder._init_fp8_prefill_ps_buffers = init
    AiterMLAMetadataBuilder._build_fp8_prefill_ps_metadata = (AiterMLAMetadataBuilder._build_staged if staged
                                                               else AiterMLAMetadataBuilder._build_direct)

    def _attn(self, q, k, v, md, out, one):
        real = self.num_heads
        nhead = heads_k(real)
        if nhead != real:
            def pad(x):
                return (x.repeat_interleave(nhead // real, dim=1) if nhead % real == 0
                        else x.repeat(1, -(-nhead // real), 1)[:, :nhead].contiguous())
            q, k, v = pad(q), pad(k), pad(v)
        q, k, v = (x.to(platform.fp8_dtype()) for x in (q, k, v))
        t, dv = q.shape[0], self.v_head_dim
        n = md.fp8_prefill_num_partial_tiles
        specs = [((n * TILE, nhead, dv), torch.float32), ((n * TILE, nhead), torch.float32),
                 ((t, nhead), torch.float32)]
        if nhead != real:
            specs.append(((t, nhead, dv), out.dtype))
        logits, lse, final_lse, *pad_out = ws.current_workspace_manager().get_simultaneous(*specs)
        o3 = pad_out[0] if pad_out else out.view(t, nhead, dv)
        self._mla_prefill_ps_asm_fwd(q, k, v, md.fp8_prefill_qo_indptr, md.fp8_prefill_kv_indptr,
                                     md.fp8_prefill_kv_indices, md.fp8_prefill_work_indptr,
                                     md.fp8_prefill_work_info_set, md.fp8_prefill_max_q_len, self.scale, True,
                                     logits, lse, o3, one, one, one)
        self._mla_reduce_v1(logits, lse, md.fp8_prefill_reduce_indptr, md.fp8_prefill_reduce_final_map,
                            md.fp8_prefill_reduce_partial_map, TILE, 0, o3, final_lse)
        if pad_out:
            real_o = o3[:, ::nhead // real] if nhead % real == 0 else o3[:, :real]
            out.view(t, real, dv).copy_(real_o)

    def attn_per_call_scale(self, q, k, v, attn_metadata, out):
        _attn(self, q, k, v, attn_metadata, out, torch.ones((), dtype=torch.float32, device=q.device))

    def attn_cached_scale(self, q, k, v, attn_metadata, out):
        if self._fp8_prefill_one_scale is None:
            self._fp8_prefill_one_scale = torch.ones((), dtype=torch.float32, device=q.device)
        _attn(self, q, k, v, attn_metadata, out, self._fp8_prefill_one_scale)

    class AiterMLAImpl:
        _mla_fp8_prefill_attn = attn_cached_scale if cached else attn_per_call_scale

    mod.AiterMLAHelper = AiterMLAHelper
    mod.AiterMLAMetadataBuilder = AiterMLAMetadataBuilder
    mod.AiterMLAImpl = AiterMLAImpl
    mod._fp8_mla_prefill_supported = lambda: True
    return mod


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def _install(monkeypatch, version: str, cu_num: int = CU):
    """Register stand-in vLLM modules for ``version``; return (adapter factory, vllm module, ws module)."""
    tag = "fake_vllm_" + version.replace(".", "_")
    ws = _make_workspace_module(f"{tag}.workspace")
    mod = _make_vllm_module(version, f"{tag}.rocm_aiter_mla", ws, cu_num)
    monkeypatch.setitem(sys.modules, ws.__name__, ws)
    monkeypatch.setitem(sys.modules, mod.__name__, mod)

    def adapter(aiter=None, fault=None):
        return for_testing(aiter or _standin(cu_num), mod.__name__, ws.__name__, fault)

    return adapter, mod, ws


def _standin(cu_num: int = CU, **kw) -> types.ModuleType:
    """The stand-in aiter with ``get_ps_metadata_info_v1`` giving 1-D sizes as bare ints, as real
    AITER does (``(2, torch.uint64)``, ``(cu_num + 1, torch.int32)``...; 2-D sizes stay tuples)."""
    aiter = make_standin_aiter(cu_num=cu_num, **kw)
    fn = aiter.get_ps_metadata_info_v1

    @functools.wraps(fn)
    def get_ps_metadata_info_v1(*args, **kwargs):
        return [(s[0] if isinstance(s, tuple) and len(s) == 1 else s, d) for s, d in fn(*args, **kwargs)]

    aiter.get_ps_metadata_info_v1 = get_ps_metadata_info_v1
    return aiter


CPU = PlatformInfo("cpu", torch.device("cpu"), "cpu", "test cpu", torch.float8_e4m3fn, torch.__version__, None, None, 0)


def _emulated(inputs, pad_to: int | None = None):
    """aiter-emulated on ``inputs`` (cast), optionally on inputs padded to ``pad_to`` heads as vLLM pads."""
    if pad_to is not None and pad_to != inputs.case.num_heads:
        n = inputs.case.num_heads

        def pad(x):
            return (x.repeat_interleave(pad_to // n, dim=1) if pad_to % n == 0
                    else x.repeat(1, -(-pad_to // n), 1)[:, :pad_to].contiguous())

        q, k, v = pad(inputs.q), pad(inputs.k), pad(inputs.v)
        inputs = replace(inputs, case=replace(inputs.case, num_heads=pad_to), q=q, k=k, v=v,
                         q8=quantize(q, "cast"), k8=quantize(k, "cast"), v8=quantize(v, "cast"))
    return AiterEmulated(cu_num=CU).prepare(inputs).run().clone()


def _source_heads(real: int, padded: int) -> list[int]:
    """For each padded head, the first padded head holding the same real head."""
    if padded % real == 0:
        r = padded // real
        return [i // r * r for i in range(padded)]
    return [i % real for i in range(padded)]


def _real_heads(out_padded: torch.Tensor, real: int) -> torch.Tensor:
    padded = out_padded.shape[1]
    return out_padded[:, ::padded // real] if padded % real == 0 else out_padded[:, :real]


# ------------------------------------------------------------------------------------------------
# availability / registry


def test_registry_and_cpu_availability_never_import_vllm_or_aiter():
    b = get_backend("vllm-aiter")
    assert isinstance(b, VllmAiter)
    before = {m for m in sys.modules if m.split(".")[0] in ("vllm", "aiter")}
    v = b.availability(CPU)
    assert not v and v.reason == ("needs an AMD gfx950 GPU with a ROCm build of torch; found no GPU visible to torch "
                                  f"{CPU.torch_version}")
    nv = replace(CPU, vendor="cuda", arch="sm_90", device=torch.device("cpu"))
    assert b.availability(nv).reason == "needs an AMD gfx950 GPU with a ROCm build of torch; found sm_90"
    mi300 = replace(CPU, vendor="rocm", arch="gfx942")
    assert "gfx942" in b.availability(mi300).reason
    assert {m for m in sys.modules if m.split(".")[0] in ("vllm", "aiter")} == before


def test_unknown_adapter_fault_is_rejected():
    with pytest.raises(ValueError, match="reduce-8-arg"):
        FaultyVllmAiter(adapter_fault="nope")


# ------------------------------------------------------------------------------------------------
# feature detection and support


@pytest.mark.parametrize("version,expect", [
    ("0.28", VllmFeatures(False, False, False, False, False)),
    ("0.29", VllmFeatures(True, True, False, False, False)),
    ("0.31", VllmFeatures(True, True, True, False, False)),
    ("0.32", VllmFeatures(True, True, True, True, False)),
    ("0.33", VllmFeatures(True, True, True, True, True)),
])
def test_features_are_detected_from_code_not_version_strings(monkeypatch, version, expect):
    _, mod, _ = _install(monkeypatch, version)
    assert detect_features(mod) == expect


def test_missing_entry_is_unavailable_with_reason(monkeypatch):
    adapter, mod, _ = _install(monkeypatch, "0.33")
    monkeypatch.delattr(mod.AiterMLAImpl, "_mla_fp8_prefill_attn")
    v = adapter().availability(CPU)
    assert not v and "AiterMLAImpl._mla_fp8_prefill_attn" in v.reason and "vllm >= 0.28" in v.reason


def test_old_reduce_form_is_unavailable(monkeypatch):
    adapter, _, _ = _install(monkeypatch, "0.33")
    v = adapter(_standin(aiter_version=(0, 1, 15))).availability(CPU)
    assert not v and "9 arguments" in v.reason and "v0.1.16" in v.reason


@pytest.mark.parametrize("version", VERSIONS)
def test_supports_heads_and_quant(monkeypatch, version):
    adapter, _, _ = _install(monkeypatch, version)
    b = adapter()
    assert b.availability(CPU)
    v = b.supports(parse_case_id("s256"), CPU)
    assert not v and "unit scale" in v.reason and "'s256-cast'" in v.reason
    for h in (16, 32, 64):
        assert b.supports(parse_case_id(f"s256-h{h}-cast" if h != 16 else "s256-cast"), CPU)
    for h in (8, 12, 24):
        v = b.supports(parse_case_id(f"s256-h{h}-cast"), CPU)
        if version == "0.28":
            assert not v and "num_heads % 16 == 0" in v.reason and "0.29" in v.reason
        else:
            assert v, v.reason
    v = b.supports(parse_case_id("s256-h72-cast"), CPU)  # pads to 80: no mla_reduce_v1 kernel up to v0.1.20
    assert not v and ("at 80" in v.reason if version != "0.28" else "% 16" in v.reason)
    if version != "0.28":
        v = b.supports(parse_case_id("s256-h136-cast"), CPU)
        assert not v and "is_valid_num_heads" in v.reason


@pytest.mark.parametrize("version", VERSIONS)
def test_context_chunk_and_prefix_cases_are_skips_naming_vllm_52356(monkeypatch, version):
    """vLLM skips the FP8 PS path for batches with cached context (vLLM #52356, up to 0.33.0)."""
    adapter, _, _ = _install(monkeypatch, version)
    b = adapter()
    for cid in ("ctx1024-q256-cast", "prefix1024-q300-cast", "prefix-ragged-1024q256-0q300-cast"):
        case = parse_case_id(cid)
        v = b.supports(case, CPU)
        assert not v and "#52356" in v.reason and case.family in v.reason
        with pytest.raises(NotImplementedError, match="#52356"):
            b.plan_stats(case, CPU)
    assert b.supports(parse_case_id("s256-cast"), CPU)


@pytest.mark.parametrize("aiter_version", [(0, 1, 20), (0, 1, 22)])
def test_vllm_0_33_runs_on_both_aiter_revisions_without_max_kvlen(monkeypatch, aiter_version):
    """vLLM 0.33 calls get_ps_metadata_info_v1 without max_kvlen; on a #3606 aiter (0.1.22) the path still
    equals aiter-emulated of that revision bit for bit, and the reservation follows that release's bound."""
    adapter, _, _ = _install(monkeypatch, "0.29")  # 0.29/0.30 reserve from AITER's info bound
    aiter = _standin(aiter_version=aiter_version)
    b = adapter(aiter)
    inputs = make_inputs(parse_case_id("ragged-300-40-cast"))
    p = b.prepare(inputs)
    try:
        out = p.run().clone()
    finally:
        p.cleanup()
    ref = AiterEmulated(cu_num=CU, aiter_version=aiter_version).prepare(inputs).run()
    assert torch.equal(out, ref)
    infos = [c["args"] for c in aiter.calls if c["name"] == "get_ps_metadata_info_v1"]
    assert infos and all(a.get("max_kvlen") is None for a in infos)
    assert p.extras["reserved_workspace_bytes"] == p.extras["workspace_bytes"] > 0
    stats = b.plan_stats(parse_case_id("ragged-300-40-cast"), CPU)
    cpc = CU // math.gcd(16, CU)
    slots = (min(2 + cpc - 1, 2 * (cpc - 1)) * 2 if aiter_version < (0, 1, 22)
             else 2 * 2 + cpc - 1)  # info bound of each release (v0.1.22: B*T + cpc - 1)
    rows = slots * TILE
    want = sum((n + 255) // 256 * 256 for n in (rows * 16 * 128 * 4, rows * 16 * 4, 340 * 16 * 4))
    assert stats["reserved_workspace_bytes"] == stats["workspace_bytes"] == want


# ------------------------------------------------------------------------------------------------
# the call: exact agreement with aiter-emulated, what vLLM passes, workspace lifecycle


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("cid", ["s257-cast", "ragged-255-1-300-cast", "s100-h12-cast", "s60-h24-cast",
                                 "s70-h8-cast-mla"])
def test_output_equals_aiter_emulated_exactly(monkeypatch, version, cid):
    adapter, _, ws = _install(monkeypatch, version)
    aiter = _standin()
    b = adapter(aiter)
    case = parse_case_id(cid)
    sup = b.supports(case, CPU)
    if version == "0.28" and case.num_heads % 16:
        assert not sup
        return
    assert sup, sup.reason
    inputs = make_inputs(case)
    p = b.prepare(inputs)
    try:
        assert p.timing_scope == "call" and p.graph_capturable is False
        assert ws.current_workspace_manager().is_locked() and p.extras["workspace_locked"] is True
        out = p.run().clone()
        assert torch.equal(p.run(), out)  # repeatable
    finally:
        p.cleanup()
    assert not ws.is_workspace_manager_initialized()
    padded = p.extras["num_head_k"]
    assert padded == (case.num_heads if version == "0.28" else -(-case.num_heads // 16) * 16)
    ref = _emulated(inputs, padded)
    if padded != case.num_heads:  # padded heads duplicate real ones: exact, and invisible in the output
        assert torch.equal(ref, ref[:, _source_heads(case.num_heads, padded)])
        ref = _real_heads(ref, case.num_heads)
    assert out.shape == ref.shape and torch.equal(out, ref)
    # what vLLM handed AITER
    asm = [c for c in aiter.calls if c["name"] == "mla_prefill_ps_asm_fwd"][-1]["args"]
    assert asm["Q"]["shape"][1] == padded and asm["Q"]["dtype"] == "float8_e4m3fn"
    assert asm["q_scale"]["value"] == 1.0 and asm["q_scale"]["shape"] == ()
    red = [c for c in aiter.calls if c["name"] == "mla_reduce_v1"][-1]["args"]
    assert red["max_seqlen_q"] == 256 and red["num_kv_splits"] == 0 and red["final_output"]["dtype"] == "bfloat16"
    info = [c for c in aiter.calls if c["name"] == "get_ps_metadata_info_v1"][0]["args"]
    assert info["num_head_k"] == padded and info["batch_size"] == case.batch_size


@pytest.mark.parametrize("version", VERSIONS)
def test_prepare_failure_resets_the_workspace(monkeypatch, version):
    adapter, _, ws = _install(monkeypatch, version)
    aiter = _standin()

    def boom(*a, **k):
        raise RuntimeError("planner exploded")

    aiter.get_ps_metadata_v1 = boom
    before = sys.modules.get("aiter")
    with pytest.raises(RuntimeError, match="planner exploded"):
        adapter(aiter).prepare(make_inputs(parse_case_id("s64-cast")))
    assert not ws.is_workspace_manager_initialized()
    assert sys.modules.get("aiter") is before  # the stand-in was only visible during the build


@pytest.mark.parametrize("version", ["0.28", "0.33"])
def test_raising_call_still_resets_global_state_through_the_runner(monkeypatch, version):
    adapter, _, ws = _install(monkeypatch, version)
    aiter = _standin()

    def boom(*a, **k):
        raise RuntimeError("kernel exploded")

    aiter.mla_prefill_ps_asm_fwd = boom
    case = parse_case_id("s64-cast")
    rec = evaluate_one(adapter(aiter), CaseData(case, CPU, None), CPU, RunOptions(timing=False, determinism=False))
    assert rec.status == "error" and "kernel exploded" in rec.reason
    assert not ws.is_workspace_manager_initialized()


@pytest.mark.parametrize("version", VERSIONS)
def test_plan_stats_workspace_is_the_reservation_the_formula_predicts(monkeypatch, version):
    """plan_stats reports what vLLM's manager holds; the workspace formula ``plan`` uses predicts it."""
    adapter, _, ws = _install(monkeypatch, version)
    b = adapter()
    feats = b.entry().features
    for cid in ("s600-cast", "ragged-300-17-1000-cast", "s100-h12-cast", "s100-h24-cast"):
        case = parse_case_id(cid)
        if not b.supports(case, CPU):
            assert version == "0.28"
            continue
        st = b.plan_stats(case, CPU, repeats=3)
        assert len(st["planner_samples_s"]) == 3 and st["num_partials"] >= 0
        info = b.driver().m.get_ps_metadata_info_v1(batch_size=case.batch_size, num_head_k=st["num_head_k"],
                                                    max_qlen=case.max_seq_len, qlen_granularity=TILE)
        want = vllm_reserved(budget_sizing=feats.budget_sizing, pads_heads=feats.pads_heads,
                             info_partial_slots=info[5][0], max_num_batched_tokens=case.total_tokens,
                             max_num_reqs=case.batch_size,
                             num_compute_units=CU, num_heads=case.num_heads, num_head_k=st["num_head_k"])[1].total
        assert st["workspace_bytes"] == st["reserved_workspace_bytes"] == want, (cid, st)
        assert not ws.is_workspace_manager_initialized()
    # per_tensor ids are planned like their cast twins (the plan ignores the quantisation)
    assert b.plan_stats(parse_case_id("s600"), CPU, repeats=1)["workspace_bytes"] > 0


# ------------------------------------------------------------------------------------------------
# deliberately wrong adapters fail clearly


def test_fault_reduce_8_arg_form_is_caught(monkeypatch):
    adapter, _, ws = _install(monkeypatch, "0.33")
    p = adapter(fault="reduce-8-arg").prepare(make_inputs(parse_case_id("s300-cast")))
    try:
        with pytest.raises(StandinContractError, match=r"num_kv_splits got a Tensor.*#46760"):
            p.run()
    finally:
        p.cleanup()
    assert not ws.is_workspace_manager_initialized()


@pytest.mark.parametrize("version", ["0.29", "0.33"])
def test_fault_omit_attn_out_dtype_is_caught(monkeypatch, version):
    adapter, _, ws = _install(monkeypatch, version)
    with pytest.raises(VllmAdapterError, match=r"attn_out_dtype.*missing a required argument: 'attn_out_dtype'"):
        adapter(fault="omit-attn-out-dtype").prepare(make_inputs(parse_case_id("s64-cast")))
    assert not ws.is_workspace_manager_initialized()


def test_passing_attn_out_dtype_to_0_28_is_caught(monkeypatch):
    adapter, _, _ = _install(monkeypatch, "0.28")
    b = adapter()
    b.entry()
    b._entry = replace(b._entry, features=replace(b._entry.features, attn_out_dtype=True))  # a wrong detection
    with pytest.raises(VllmAdapterError, match="unexpected keyword argument 'attn_out_dtype'"):
        b.prepare(make_inputs(parse_case_id("s64-cast")))


def test_fault_skip_one_scale_is_caught_on_0_33(monkeypatch):
    adapter, _, _ = _install(monkeypatch, "0.33")
    p = adapter(fault="skip-one-scale").prepare(make_inputs(parse_case_id("s64-cast")))
    try:
        with pytest.raises(AttributeError, match="_fp8_prefill_one_scale"):
            p.run()
    finally:
        p.cleanup()


def test_fault_no_lock_is_visible(monkeypatch):
    adapter, _, ws = _install(monkeypatch, "0.31")
    p = adapter(fault="no-lock").prepare(make_inputs(parse_case_id("s64-cast")))
    try:
        assert p.extras["workspace_locked"] is False and not ws.current_workspace_manager().is_locked()
    finally:
        p.cleanup()


@pytest.mark.parametrize("cid,planned,forward", [("s600-cast", 16, 16), ("s300-h24-cast", 24, 32)])
def test_growth_after_lock_is_an_error_record_naming_both_widths(monkeypatch, cid, planned, forward):
    """A 0.31+ reservation sized for 1 CU under a 256-CU plan makes the forward grow the locked workspace
    (vLLM #42978): an ``error`` record naming the plan's and the forward's head widths. At 24 heads the builder
    sizes as a short-lived vLLM revision did (``max(16, n)``: 24) while the forward pads to 32."""
    _, mod, ws = _install(monkeypatch, "0.31", cu_num=1)
    helper, builder = mod.AiterMLAHelper, mod.AiterMLAMetadataBuilder
    forward_width = helper.get_fp8_prefill_num_heads

    def sized_max16(method):
        @functools.wraps(method)
        def wrapped(self, *args, **kwargs):
            helper.get_fp8_prefill_num_heads = staticmethod(lambda n: max(16, n))
            try:
                return method(self, *args, **kwargs)
            finally:
                helper.get_fp8_prefill_num_heads = staticmethod(forward_width)
        return wrapped

    for name in ("_init_fp8_prefill_ps_buffers", "_build_fp8_prefill_ps_metadata"):
        monkeypatch.setattr(builder, name, sized_max16(getattr(builder, name)))
    b = for_testing(_standin(256), mod.__name__, ws.__name__)
    rec = evaluate_one(b, CaseData(parse_case_id(cid), CPU, None), CPU, RunOptions(timing=False, determinism=False))
    assert rec.status == "error", rec
    want = (f"WorkspaceGrewAfterLock: the workspace grew after lock_workspace(): the builder planned and reserved "
            f"{planned} heads, the forward runs {forward} (vLLM: Workspace is locked but allocation requires")
    assert want in rec.reason
    assert not ws.is_workspace_manager_initialized()


def test_every_adapter_fault_is_covered():
    assert set(ADAPTER_FAULTS) == {"reduce-8-arg", "omit-attn-out-dtype", "skip-one-scale", "no-lock"}


class _GatedBuilder:
    def __init__(self, kv_cache_dtype_str, model_dtype, supported):
        self._fp8_prefill_enabled = supported and (
            kv_cache_dtype_str == "fp8"
            and model_dtype == torch.bfloat16
        )
        if self._fp8_prefill_enabled:
            self.buffers = True


class _UngatedBuilder:
    def __init__(self, num_heads, supported):
        self._fp8_prefill_enabled = (supported and num_heads % 16 == 0)
        if self._fp8_prefill_enabled:
            self.buffers = True


def test_fp8_path_condition_reads_the_builders_own_gate():
    """The record says whether vLLM takes the FP8 path for an fp8 KV cache and a bf16 model: a builder that
    tests both dtypes takes it only then; one that tests neither takes it for any dtypes (vLLM #52312)."""
    from mla_fp8_bench.backends.vllm_aiter import fp8_path_condition

    gated, ungated = fp8_path_condition(_GatedBuilder), fp8_path_condition(_UngatedBuilder)
    assert gated["taken"] is True and gated["gates_on_dtypes"] is True
    assert "only with an fp8 KV cache and a bf16 model" in gated["why"]
    assert ungated["taken"] is True and ungated["gates_on_dtypes"] is False and "#52312" in ungated["why"]
    assert (gated["kv_cache_dtype"], gated["model_dtype"]) == ("fp8", "bfloat16")

    class NoPath:
        def __init__(self):
            self.x = 1

    assert fp8_path_condition(NoPath)["taken"] is False

