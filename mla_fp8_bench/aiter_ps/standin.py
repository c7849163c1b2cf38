"""A stand-in ``aiter`` module for CPU contract tests of code that drives AITER's PS FP8 MLA prefill
(docs/aiter-contract.md#standin, #api, #versions): the four primitives as the emulated AITER version shows
them (opaque ``(*args, **kwargs)`` ops with a registered torch op schema, and the plain-Python info
function), each validating like a strict launcher (:class:`StandinContractError`), then running the planner
port or the emulator. Never imports the real ``aiter``.
"""

from __future__ import annotations

import importlib.machinery
import inspect
import itertools
import math
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from mla_fp8_bench.aiter_ps.emulator import EMULATOR, Emulator
from mla_fp8_bench.aiter_ps.facts import (
    BUFFER_NAMES,
    NEWEST_MODELLED_VERSION,
    PLANNER_PR_3606_REF,
    PLANNER_PRE_3606,
    PLANNER_REVISIONS,
    PLANNER_V0_1_22,
    PS_PREFILL_FIRST_VERSION,
    Q_TILE,
    SPLIT_DATA_MAX_BYTES,
    WORK_INFO_COLS,
    format_version,
    kvlen_granularity_for,
    parse_aiter_version,
    planner_revision_for,
    reduce_arity_for_version,
    reduce_heads_for,
    unpack_q_head_range,
)
from mla_fp8_bench.problem.shapes import QK_HEAD_DIM as _QK_DIM  # the kernel's hard-wired H*192 / H*128 strides
from mla_fp8_bench.problem.shapes import V_HEAD_DIM as _V_DIM

_FP8 = torch.float8_e4m3fn


class StandinContractError(ValueError):
    """A call the real AITER primitive would mishandle (garbage, GPU fault, memory corruption or a
    dispatch error); the message names the function, the argument and the contract."""


# argument checks (each raises StandinContractError naming fn + argument)


def _summary(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        d: dict[str, Any] = {"shape": tuple(v.shape), "dtype": str(v.dtype).replace("torch.", ""),
                             "device": str(v.device), "contiguous": v.is_contiguous()}
        if (v.numel() == 1 and v.dtype in (torch.float32, torch.float64, torch.int32, torch.int64)
                and v.device.type != "meta"):
            d["value"] = v.item()
        return d
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return repr(v)[:80]


class _Checker:
    def __init__(self, fn: str) -> None:
        self.fn = fn

    def fail(self, msg: str) -> None:
        raise StandinContractError(f"{self.fn}: {msg}")

    def tensor(self, name: str, t: Any) -> torch.Tensor:
        if t is None:
            self.fail(f"{name} is None: the real binding dereferences it unconditionally")
        if not isinstance(t, torch.Tensor):
            self.fail(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        return t

    def dtype(self, name: str, t: torch.Tensor, *dtypes: torch.dtype, why: str = "") -> None:
        if t.dtype not in dtypes:
            allowed = " or ".join(str(d).replace("torch.", "") for d in dtypes)
            self.fail(f"{name} has dtype {str(t.dtype).replace('torch.', '')}: must be {allowed}{why}")

    def contiguous(self, name: str, t: torch.Tensor, why: str) -> None:
        if not t.is_contiguous():
            self.fail(f"{name} is not contiguous (strides {tuple(t.stride())}): {why}")

    def array(self, name: str, t: Any, dtypes: tuple[torch.dtype, ...], want: str, why: str = "",
              contiguous: str | None = None) -> torch.Tensor:
        """A tensor of ``dtypes`` and the rank of ``want`` (``"[R, H]"``); contiguous if ``contiguous`` (why)."""
        t = self.tensor(name, t)
        self.dtype(name, t, *dtypes, why=why)
        if t.dim() != want.count(",") + 1:
            self.fail(f"{name} has shape {tuple(t.shape)}: must be {want}")
        if contiguous is not None:
            self.contiguous(name, t, contiguous)
        return t

    def ints(self, name: str, t: Any, cols: int | None = None) -> torch.Tensor:
        """A contiguous int32 tensor, 1-D or ``[n, cols]``."""
        t = self.tensor(name, t)
        self.dtype(name, t, torch.int32, why=" (the binding reads int32)")
        want = "int32 1-D" if cols is None else f"[n, {cols}] int32"
        if t.dim() != (1 if cols is None else 2) or (cols is not None and t.shape[1] != cols):
            self.fail(f"{name} has shape {tuple(t.shape)}: must be {want}")
        self.contiguous(name, t, "read as raw contiguous int32 memory")
        return t

    def py_int(self, name: str, v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            self.fail(f"{name} must be a Python int, got {type(v).__name__} {_summary(v)!r:.60}")
        return int(v)

    def py_bool(self, name: str, v: Any) -> bool:
        if not isinstance(v, bool):
            self.fail(f"{name} must be a bool, got {type(v).__name__} {v!r:.40}")
        return v

    def indptr(self, name: str, t: Any) -> list[int]:
        """An int32 indptr's values (``[B+1]``, from 0, non-decreasing)."""
        vals = self.ints(name, t).tolist()
        if len(vals) < 2:
            self.fail(f"{name} has {len(vals)} entries: needs B+1 >= 2")
        if vals[0] != 0 or vals != sorted(vals):
            self.fail(f"{name} must start at 0 and be non-decreasing, got {vals[:8]}")
        return vals

    def scale(self, name: str, t: Any, device: torch.device) -> None:
        if t is None:
            self.fail(f"{name} is None: the kernel always reads the scale, a null dereference on hardware "
                      "(pass a one-element fp32 device tensor, 1.0 for unit scale; docs/aiter-contract.md#kernel-args)")
        t = self.tensor(name, t)
        self.dtype(name, t, torch.float32, why=" (one-element fp32 dequant multiplier)")
        if t.numel() != 1 or t.dim() > 1:
            self.fail(f"{name} has shape {tuple(t.shape)}: must be [1] or [] (one fp32 element)")
        if t.device != device:
            self.fail(f"{name} is on {t.device}: must be a device tensor on {device} like Q")


# module state and call recording


@dataclass
class _State:
    """What one stand-in module emulates, and its call log."""

    cu_num: int
    version: tuple[int, int, int]
    variant: int
    heads_ok: tuple[int, ...]
    emulator: Emulator
    revision: str
    calls: list[dict[str, Any]] = field(default_factory=list)

    @property
    def post_3606(self) -> bool:
        """The reduce merges groups of one partial (every revision after the pre-#3606 one)."""
        return self.revision != PLANNER_PRE_3606

    def record(self, name: str, args: dict[str, Any], body: Callable[[], Any]) -> Any:
        """Run ``body`` and log ``{"name", "args", "ok", "error"}``."""
        entry = {"name": name, "args": {k: _summary(v) for k, v in args.items()}, "ok": None, "error": None}
        self.calls.append(entry)
        try:
            out = body()
        except Exception as exc:
            entry["ok"], entry["error"] = False, f"{type(exc).__name__}: {exc}"
            raise
        entry["ok"] = True
        return out


# get_ps_metadata_info_v1


def _info_body(st: _State, a: dict[str, Any]) -> list[tuple[Any, torch.dtype]]:
    """Six ``(shape, dtype)`` pairs at ``st.cu_num``, 1-D sizes as bare ints as in ``aiter/ops/attention.py``."""
    from mla_fp8_bench.aiter_ps.planner import PsPlanError, ps_metadata_info

    ck = _Checker("get_ps_metadata_info_v1")
    for k in ("batch_size", "num_head_k", "max_qlen", "qlen_granularity", "kvlen_granularity"):
        if k in a and ck.py_int(k, a[k]) < (1 if k in ("num_head_k", "qlen_granularity", "kvlen_granularity") else 0):
            ck.fail(f"{k}={a[k]} is out of range")
    extra: dict[str, Any] = {}
    if st.revision == PLANNER_PR_3606_REF:
        if a["max_kvlen"] is not None and ck.py_int("max_kvlen", a["max_kvlen"]) < 0:
            ck.fail(f"max_kvlen={a['max_kvlen']} is out of range: None or an int >= 0")
        extra = dict(max_kvlen=a["max_kvlen"], kvlen_granularity=a["kvlen_granularity"])
    try:
        info = ps_metadata_info(a["batch_size"], a["num_head_k"], a["max_qlen"], a["qlen_granularity"],
                                cu_num=st.cu_num, revision=st.revision, **extra)
    except PsPlanError as exc:
        ck.fail(str(exc))
    return [(int(shape[0]) if len(shape) == 1 else tuple(shape), getattr(torch, dt)) for shape, dt in info.values()]


# get_ps_metadata_v1


def _planner_body(st: _State, a: dict[str, Any]) -> None:
    """Validate, plan with the port (this version's semantics) and fill the six buffers in place."""
    from mla_fp8_bench.aiter_ps.planner import PsPlanError, fill_aiter_buffers, plan_ps_prefill

    ck = _Checker("get_ps_metadata_v1")
    qo = ck.indptr("seqlens_qo_indptr", a["seqlens_qo_indptr"])
    kv = ck.indptr("pages_kv_indptr", a["pages_kv_indptr"])
    ctx = ck.ints("context_lens", a["context_lens"]).tolist()
    if len(kv) != len(qo) or len(ctx) != len(qo) - 1:
        ck.fail(f"lengths disagree: seqlens_qo_indptr {len(qo)}, pages_kv_indptr {len(kv)} (need B+1), "
                f"context_lens {len(ctx)} (need B)")
    # the fixed keywords of the PS prefill
    for k, ok, why in (("gqa_ratio", 1, "the PS prefill kernel exists only for gqa_ratio=1 (MHA)"),
                       ("num_heads_k", None, None), ("qhead_granularity", 1, "must be 1 (one head per work)"),
                       ("qlen_granularity", Q_TILE, f"must be {Q_TILE} (the kernel's q-tile)"),
                       ("block_size", 1, "the PS prefill runs at page size 1")):
        v = ck.py_int(k, a[k])
        if ok is None and v < 1:
            ck.fail(f"{k}={v} must be >= 1")
        if ok is not None and v != ok:
            ck.fail(f"{k}={v}: {why}")
    kg = ck.py_int("kvlen_granularity", a["kvlen_granularity"])
    if kg != kvlen_granularity_for(a["block_size"]):
        ck.fail(f"kvlen_granularity={kg}: must be max(128, block_size)=128, passed explicitly - the "
                "binding's real default is 1 (the stub shows 16), which plans KV splits off the "
                "kernel's 128-key tiles")
    causal = ck.py_bool("is_causal", a["is_causal"])
    need_lse = ck.py_bool("need_lse", a["need_lse"]) if "need_lse" in a else None
    # buffer dtypes/ranks; work_indptr sized for this device's CU count
    ck.tensor("work_metadata_ptrs", a["work_metadata_ptrs"])
    if a["work_metadata_ptrs"].numel() < 2:
        ck.fail(f"work_metadata_ptrs has {a['work_metadata_ptrs'].numel()} elements: must be uint64 [2]")
    wi = ck.ints("work_indptr", a["work_indptr"])
    if wi.numel() != st.cu_num + 1:
        ck.fail(f"work_indptr has {wi.numel()} entries: must be cu_num+1 = {st.cu_num + 1} for this "
                f"device ({st.cu_num} CUs); size buffers with get_ps_metadata_info_v1 on the same device "
                "(no CU masking)")
    for name, cols in (("work_info", WORK_INFO_COLS), ("reduce_indptr", None), ("reduce_final_map", 2),
                       ("reduce_partial_map", None)):
        ck.ints(name, a[name], cols)
    try:
        plan = plan_ps_prefill(qo, kv, ctx, num_heads_k=a["num_heads_k"], cu_num=st.cu_num, kvlen_granularity=kg,
                               block_size=1, is_causal=causal, revision=st.revision, need_lse=need_lse)
    except PsPlanError as exc:
        ck.fail(f"invalid planner input: {exc}")
    ng = plan.num_reduce_groups  # the real planner writes without bounds checks
    for name, need, unit in (("work_info", plan.num_works, "rows"), ("reduce_indptr", ng + 1, "entries"),
                             ("reduce_final_map", ng, "rows"), ("reduce_partial_map", plan.num_partials, "entries")):
        if (have := a[name].shape[0]) < need:
            ck.fail(f"{name} is undersized: {have} {unit} < {need} needed by this plan; the real "
                    "planner writes past it without bounds checks and corrupts host memory "
                    "(size with get_ps_metadata_info_v1)")
    fill_aiter_buffers(plan, *(a[n] for n in BUFFER_NAMES))


# mla_prefill_ps_asm_fwd


def _check_kernel_qkv(ck: _Checker, Q: Any, K: Any, V: Any) -> tuple[int, int]:
    """Q/K/V contiguous float8_e4m3fn ``[T, H, 192]`` / ``[P, H, 192]`` / ``[P, H, 128]`` on one device."""
    for name, t, d in (("Q", Q, _QK_DIM), ("K", K, _QK_DIM), ("V", V, _V_DIM)):
        if isinstance(t, torch.Tensor) and t.dtype == torch.float8_e4m3fnuz:
            ck.fail(f"{name} is float8_e4m3fnuz (the gfx942 format, max 240): gfx950 needs float8_e4m3fn")
        ck.array(name, t, (_FP8,), f"[tokens, H, {d}]")
        if t.shape[-1] != d:
            ck.fail(f"{name} head dim is {t.shape[-1]}: must be {d} (hard-wired H*{d} byte strides)")
        why = "no strides reach the kernel"
        ck.contiguous(name, t, why + (" (V must be its own tensor, not a slice of K)" if name == "V" else ""))
    T, H = int(Q.shape[0]), int(Q.shape[1])
    if K.shape[1] != H or V.shape[1] != H:
        ck.fail(f"head counts differ: Q {H}, K {K.shape[1]}, V {V.shape[1]} (H_q must equal H_kv)")
    if K.shape[0] != V.shape[0]:
        ck.fail(f"K has {K.shape[0]} pages but V has {V.shape[0]}")
    for name, t in (("K", K), ("V", V)):
        if t.device != Q.device:
            ck.fail(f"{name} is on {t.device}, Q on {Q.device}")
    return T, H


def _check_kernel_metadata(ck: _Checker, a: dict[str, Any], T: int, num_page: int) -> tuple[list[int], ...]:
    """Indptrs, page indices and work buffers; returns ``(qo, kvp, work_indptr)`` as lists."""
    qo = ck.indptr("qo_indptr", a["qo_indptr"])
    kvp = ck.indptr("kv_indptr", a["kv_indptr"])
    if len(qo) != len(kvp):
        ck.fail(f"qo_indptr has {len(qo)} entries, kv_indptr {len(kvp)}: both must be B+1")
    if qo[-1] > T:
        ck.fail(f"qo_indptr[-1]={qo[-1]} exceeds Q's {T} rows")
    pages = ck.ints("kv_page_indices", a["kv_page_indices"])
    if kvp[-1] > pages.numel():
        ck.fail(f"kv_indptr[-1]={kvp[-1]} exceeds kv_page_indices' {pages.numel()} entries")
    if pages.numel() and (int(pages.min()) < 0 or int(pages.max()) >= num_page):
        ck.fail(f"kv_page_indices has values outside [0, {num_page}) (K/V pages)")
    if a["work_indptr"] is None:
        ck.fail("work_indptr is None: the grid is work_indptr.size(0)-1 with no null check")
    wi = ck.indptr("work_indptr", a["work_indptr"])
    winfo = ck.ints("work_info_set", a["work_info_set"], WORK_INFO_COLS)
    if wi[-1] > winfo.shape[0]:
        ck.fail(f"work_indptr reaches work {wi[-1]} but work_info_set has {winfo.shape[0]} rows")
    return qo, kvp, wi


def _check_kernel_outputs(ck: _Checker, a: dict[str, Any], T: int, H: int, dev: torch.device) -> None:
    """splitData/splitLse fp32 ``[R, H, 128]``/``[R, H]``, output bf16 ``[T, H, 128]``, scales, devices."""
    strides = "no strides reach the kernel"
    sd = ck.array("splitData", a["splitData"], (torch.float32,), f"[R, {H}, {_V_DIM}]", " (fp32 partials)", strides)
    sl = ck.array("splitLse", a["splitLse"], (torch.float32,), f"[R, {H}]", " (fp32 partial LSE)", strides)
    out = ck.array("output", a["output"], (torch.bfloat16,), f"[{T}, {H}, {_V_DIM}]",
                   " (the kernel packs bf16 itself)", strides)
    if tuple(sd.shape[1:]) != (H, _V_DIM) or tuple(sl.shape[1:]) != (H,):
        ck.fail(f"splitData {tuple(sd.shape)} / splitLse {tuple(sl.shape)}: must be [R, {H}, {_V_DIM}] / [R, {H}]")
    if sd.shape[0] != sl.shape[0]:
        ck.fail(f"splitData has {sd.shape[0]} rows but splitLse {sl.shape[0]}")
    if tuple(out.shape) != (T, H, _V_DIM):
        ck.fail(f"output has shape {tuple(out.shape)}: must be [{T}, {H}, {_V_DIM}]")
    for name in ("q_scale", "k_scale", "v_scale"):
        ck.scale(name, a[name], dev)
    for name in ("qo_indptr", "kv_indptr", "kv_page_indices", "work_indptr", "work_info_set", "splitData",
                 "splitLse", "output"):
        if a[name].device != dev:
            ck.fail(f"{name} is on {a[name].device}: every tensor must be on Q's device {dev}")


def _check_kernel_works(ck: _Checker, rows: list[list[int]], qo: list[int], kvp: list[int], H: int, causal: bool,
                        split_rows: int) -> None:
    """Works inside their sequence and head range; slots multiples of 256 that fit; causal q_len <= kv_len."""
    need_rows, B = 0, len(qo) - 1
    for n, (b, loc, q0, q1, k0, k1, _off, hr) in enumerate(rows):
        if not 0 <= b < B:
            ck.fail(f"work {n}: batch_idx {b} outside [0, {B})")
        if not (qo[b] <= q0 <= q1 <= qo[b + 1]) or not (kvp[b] <= k0 <= k1 <= kvp[b + 1]):
            ck.fail(f"work {n}: rows [{q0},{q1}) / kv [{k0},{k1}) outside sequence {b}")
        h_lo, h_hi = unpack_q_head_range(hr & 0xFFFFFFFF)
        if not 0 <= h_lo < h_hi <= H:
            ck.fail(f"work {n}: head range [{h_lo}, {h_hi}) outside [0, {H})")
        if loc != -1:
            if loc < 0 or loc % Q_TILE:
                ck.fail(f"work {n}: partial_o_loc {loc} is not -1 or a multiple of {Q_TILE}")
            need_rows = max(need_rows, loc + Q_TILE)
    if causal:
        for b in range(B):
            if qo[b + 1] - qo[b] > kvp[b + 1] - kvp[b]:
                ck.fail(f"sequence {b}: q_len {qo[b + 1] - qo[b]} > kv_len {kvp[b + 1] - kvp[b]} with "
                        "is_causal (undefined: bottom-right alignment needs q_len <= kv_len)")
    if split_rows < need_rows:
        ck.fail(f"splitData/splitLse have {split_rows} rows but the plan's partial slots need "
                f"{need_rows} (256 per slot; the kernel writes all 256 rows of a slot without bounds checks)")


def _kernel_body(st: _State, a: dict[str, Any]) -> None:
    """Validate like a strict launcher, then run the emulated kernel in place."""
    ck = _Checker("mla_prefill_ps_asm_fwd")
    T, H = _check_kernel_qkv(ck, a["Q"], a["K"], a["V"])
    num_page = int(a["K"].shape[0])
    qo, kvp, wi = _check_kernel_metadata(ck, a, T, num_page)
    ck.py_int("max_seqlen_q", a["max_seqlen_q"])
    sm = a["softmax_scale"]
    if isinstance(sm, bool) or not isinstance(sm, (int, float)):
        ck.fail(f"softmax_scale must be a Python float, got {type(sm).__name__}")
    if not math.isfinite(sm) or sm <= 0:
        ck.fail(f"softmax_scale={sm} must be finite and > 0")
    causal = ck.py_bool("is_causal", a["is_causal"])
    _check_kernel_outputs(ck, a, T, H, a["Q"].device)
    split_rows = int(a["splitData"].shape[0])
    # 32-bit buffer-descriptor limits (from the kernel's disassembly)
    for name, n_tok, width in (("Q", T, 192), ("K", num_page, 192), ("output", T, 256)):
        if n_tok * H * width >= 2**32:
            ck.fail(f"{name} spans {n_tok * H * width} bytes: the kernel's 32-bit buffer range needs < 2**32")
    if split_rows * H * _V_DIM * 4 >= SPLIT_DATA_MAX_BYTES:
        ck.fail(f"splitData spans {split_rows * H * _V_DIM * 4} bytes: must be < 2**31 (32-bit signed range)")
    rows = a["work_info_set"][: wi[-1]].tolist() if wi[-1] else []
    _check_kernel_works(ck, rows, qo, kvp, H, causal, split_rows)
    st.emulator.mla_prefill_ps_asm_fwd(
        a["Q"], a["K"], a["V"], a["qo_indptr"], a["kv_indptr"], a["kv_page_indices"], a["work_indptr"],
        a["work_info_set"], a["max_seqlen_q"], float(sm), causal, a["splitData"], a["splitLse"],
        a["output"], a["q_scale"], a["k_scale"], a["v_scale"],
    )  # fmt: skip


# mla_reduce_v1


def _reduce_body(st: _State, a: dict[str, Any]) -> None:
    """Validate like a strict launcher, then run the emulated reduce in place."""
    ck, variant = _Checker("mla_reduce_v1"), st.variant
    # inputs: fp32 contiguous partials, int32 maps, the int slots of this variant really ints
    rows = "partials are addressed as raw contiguous rows"
    po = ck.array("partial_output", a["partial_output"], (torch.float32,), "[R, H, dv]", " (fp32 partials)", rows)
    pl = ck.array("partial_lse", a["partial_lse"], (torch.float32,), "[R, H]", " (fp32 partial LSE)", rows)
    ri = ck.indptr("reduce_indptr", a["reduce_indptr"])
    fmap = ck.ints("reduce_final_map", a["reduce_final_map"], 2)
    pmap = ck.ints("reduce_partial_map", a["reduce_partial_map"])
    for k in ("max_seqlen_q", "num_kv_splits"):
        if isinstance(a.get(k), torch.Tensor):
            ck.fail(f"{k} got a Tensor {tuple(a[k].shape)}: an int is expected there - a call written for "
                    f"the {variant - 1}-argument form puts final_output into the int slot of this "
                    f"{variant}-argument binding (vLLM #46760)")
        if k in a:
            ck.py_int(k, a[k])
    # outputs: final_output bf16/fp16 [total_q, H, dv], final_lse fp32 [total_q, H] or None, one device
    fo = ck.array("final_output", a["final_output"], (torch.bfloat16, torch.float16), "[total_q, H, dv]")
    if fo.stride(-1) != 1:
        ck.fail(f"final_output's last dim is not contiguous (strides {tuple(fo.stride())})")
    H, dv = int(po.shape[-2]), int(fo.shape[-1])
    if tuple(pl.shape) != (po.shape[0], H):
        ck.fail(f"partial_lse {tuple(pl.shape)} does not match partial_output {tuple(po.shape)}: must be [R, H]")
    if fo.shape[-2] != H or po.shape[-1] != dv:
        ck.fail(f"final_output {tuple(fo.shape)} does not match partial_output {tuple(po.shape)} (H, dv)")
    fl = a["final_lse"]
    others = [("partial_lse", pl), ("reduce_indptr", a["reduce_indptr"]), ("reduce_final_map", a["reduce_final_map"]),
              ("reduce_partial_map", a["reduce_partial_map"]), ("final_output", fo)]  # fmt: skip
    if fl is not None:
        ck.dtype("final_lse", ck.tensor("final_lse", fl), torch.float32)
        if tuple(fl.shape) != (fo.shape[0], H):
            ck.fail(f"final_lse has shape {tuple(fl.shape)}: must be [total_q, H] = [{fo.shape[0]}, {H}]")
        ck.contiguous("final_lse", fl, "addressed as seq*H + head")
        others.append(("final_lse", fl))
    for nm, t in others:
        if t.device != po.device:
            ck.fail(f"{nm} is on {t.device}: every tensor must be on partial_output's device {po.device}")
    # head-count dispatch of this version; every live group's partial rows and output rows in range
    if len(ri) > 1 and (dv != _V_DIM or H not in st.heads_ok):
        ck.fail(f"doesn't support the specified settings: H={H}, dv={dv} (AITER {format_version(st.version)} "
                f"dispatches dv=128 with H in {list(st.heads_ok)}); this fails even when nothing was split, "
                "since dispatch happens whenever reduce_indptr has more than one element")
    if ri[-1] > pmap.numel():
        ck.fail(f"reduce_indptr[-1]={ri[-1]} exceeds reduce_partial_map's {pmap.numel()} entries")
    locs = pmap[: ri[-1]].tolist()
    if any(p < 0 for p in locs):
        ck.fail("reduce_partial_map has negative partial locations")
    need = max(locs, default=-Q_TILE) + Q_TILE
    if po.shape[0] < need:
        ck.fail(f"partial_output/partial_lse have {po.shape[0]} rows but reduce_partial_map needs {need} "
                "(256 rows per partial slot)")
    min_parts = 1 if st.post_3606 else 2
    live = [g for g in range(len(ri) - 1) if ri[g + 1] - ri[g] >= min_parts]
    if live and max(live) >= fmap.shape[0]:
        ck.fail(f"reduce_final_map has {fmap.shape[0]} rows but group {max(live)} is live")
    if (q1max := max((int(fmap[g, 1]) for g in live), default=0)) > fo.shape[0]:
        ck.fail(f"final_output has {fo.shape[0]} rows but the reduce writes up to row {q1max}")
    for g in live:
        q0, q1 = int(fmap[g, 0]), int(fmap[g, 1])
        if not (0 <= q0 <= q1 and q1 - q0 <= Q_TILE):
            ck.fail(f"reduce_final_map row {g} is [{q0}, {q1}): a group's rows must satisfy 0 <= q0 <= q1 and "
                    f"q1 - q0 <= {Q_TILE} (one partial slot)")
    st.emulator.mla_reduce_v1(po, pl, a["reduce_indptr"], fmap, pmap, fo, fl, post_3606=st.post_3606)


# parameters, opaque wrappers and registered schemas (as AITER's compile_ops / torch_compile_guard expose them)

_T, _TM, _TO, _I, _F, _B = "Tensor", "Tensor(a!)", "Tensor?", "SymInt", "float", "bool"
_PARAMS: dict[str, list[tuple]] = {  # (name, schema type[, default]) as in AITER's Python stubs; see _params
    "get_ps_metadata_info_v1": [
        ("batch_size", _I), ("num_head_k", _I), ("max_qlen", _I), ("qlen_granularity", _I, 256),
    ],
    "get_ps_metadata_v1": [
        ("seqlens_qo_indptr", _T), ("pages_kv_indptr", _T), ("context_lens", _T), ("gqa_ratio", _I),
        ("num_heads_k", _I), *((name, _TM) for name in BUFFER_NAMES), ("qhead_granularity", _I, 1),
        ("qlen_granularity", _I, 256), ("kvlen_granularity", _I, 16), ("block_size", _I, 16), ("is_causal", _B, True),
    ],
    "mla_prefill_ps_asm_fwd": [
        ("Q", _T), ("K", _T), ("V", _T), ("qo_indptr", _T), ("kv_indptr", _T), ("kv_page_indices", _T),
        ("work_indptr", _TO), ("work_info_set", _TO), ("max_seqlen_q", _I), ("softmax_scale", _F), ("is_causal", _B),
        ("splitData", _TM), ("splitLse", _TM), ("output", _TM), ("q_scale", _TO, None), ("k_scale", _TO, None),
        ("v_scale", _TO, None),
    ],
    "mla_reduce_v1": [  # the 7-argument form
        ("partial_output", _T), ("partial_lse", _T), ("reduce_indptr", _T), ("reduce_final_map", _TO),
        ("reduce_partial_map", _T), ("final_output", _TM), ("final_lse", _TM + "?", None),
    ],
}
#: The planner binding's real defaults, which a call gets (its schema shows the stub's 16, 16).
_CALL_DEFAULTS = {"get_ps_metadata_v1": {"kvlen_granularity": 1, "block_size": 1}}
_NAMESPACES = itertools.count()


def _params(st: _State, name: str) -> list[tuple]:
    """``name``'s parameters at this stand-in's planner revision and reduce form."""
    params = list(_PARAMS[name])
    if name == "get_ps_metadata_v1" and st.revision == PLANNER_V0_1_22:
        params.append(("need_lse", _B, False))
    if name == "get_ps_metadata_info_v1" and st.revision == PLANNER_PR_3606_REF:
        params += [("max_kvlen", _I, None), ("kvlen_granularity", _I, 128)]
    if name == "mla_reduce_v1":
        params[5:5] = [("max_seqlen_q", _I), ("num_kv_splits", _I)][: st.variant - 7]
    return params


def _schema(params: list[tuple]) -> str:
    """A torch op schema string from ``(name, type[, default])`` rows (mutable tensors numbered apart)."""
    parts = [f"{typ.replace('(a!)', f'(a{i}!)')} {name}" + (f"={default[0]}" if default else "")
             for i, (name, typ, *default) in enumerate(params)]
    return f"({', '.join(parts)}) -> ()"


def _op(st: _State, name: str, body: Callable[[_State, dict[str, Any]], Any], plain: bool = False) -> Callable:
    """``name`` as AITER hands it out: a ``(*args, **kwargs)`` wrapper (``plain``: with the signature of a
    Python function) that binds its arguments to :func:`_params` (a ``TypeError`` as for a Python call),
    then records the call and runs ``body``."""
    defaults = _CALL_DEFAULTS.get(name, {})
    sig = inspect.Signature([
        inspect.Parameter(pname, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                          default=defaults.get(pname, d[0]) if d else inspect.Parameter.empty)
        for pname, _typ, *d in _params(st, name)])

    def wrapper(*args, **kwargs):
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{name}() {exc}") from None
        bound.apply_defaults()
        a = dict(bound.arguments)
        return st.record(name, a, lambda: body(st, a))

    wrapper.__name__ = wrapper.__qualname__ = name
    wrapper.__module__ = "aiter"
    wrapper.__doc__ = f"Stand-in of ``aiter.{name}``: validates (StandinContractError), then emulates it."
    if plain:
        wrapper.__signature__ = sig
    return wrapper


# factory


def make_standin_aiter(
    *, reduce_variant: int | None = None, cu_num: int = 256, emulator: Emulator | None = None,
    aiter_version: Any = NEWEST_MODELLED_VERSION, planner_revision: str | None = None,
) -> types.ModuleType:
    """A stand-in ``aiter`` package module (not in ``sys.modules``; docs/aiter-contract.md#standin) emulating
    AITER ``aiter_version`` (default the newest modelled; below 0.1.10 only ``mla_reduce_v1``) at ``cu_num``
    CUs, with ``reduce_variant`` (7, 8, 9; None: the version's) and ``planner_revision`` (None: the
    version's) overridable. Besides the primitives it has ``__version__``, ``StandinContractError``,
    ``calls`` (one ``{"name", "args", "ok", "error"}`` dict per call), ``is_standin``, ``cu_num``,
    ``aiter_version``, ``reduce_variant``, ``accepted_reduce_heads``, ``post_3606``, ``planner_revision``
    and ``aiter_op_namespace``.

    Raises:
        ValueError: ``reduce_variant`` not in {7, 8, 9}, ``cu_num < 1``, a malformed version, or an
            unknown planner revision.
    """
    ver = parse_aiter_version(aiter_version)
    revision = planner_revision_for(ver) if planner_revision is None else planner_revision
    if revision not in PLANNER_REVISIONS:
        raise ValueError(f"planner_revision={planner_revision!r} is unknown: allowed {', '.join(PLANNER_REVISIONS)}")
    variant = reduce_arity_for_version(ver) if reduce_variant is None else reduce_variant
    if variant not in (7, 8, 9) or isinstance(variant, bool):
        raise ValueError(f"reduce_variant={reduce_variant!r} is invalid: must be 7, 8, 9 or None")
    if isinstance(cu_num, bool) or not isinstance(cu_num, int) or cu_num < 1:
        raise ValueError(f"cu_num={cu_num!r} is invalid: must be an int >= 1")
    st = _State(cu_num=cu_num, version=ver, variant=variant, heads_ok=tuple(sorted(reduce_heads_for(ver))),
                emulator=emulator or EMULATOR, revision=revision)
    mod = types.ModuleType("aiter", "Stand-in aiter (mla_fp8_bench.aiter_ps.standin): emulated, CPU-only.")
    mod.__spec__ = importlib.machinery.ModuleSpec("aiter", None, is_package=True)
    mod.__path__ = []
    mod.__version__ = format_version(ver)
    mod.is_standin, mod.StandinContractError, mod.calls = True, StandinContractError, st.calls
    mod.cu_num, mod.aiter_version, mod.reduce_variant = cu_num, ver, variant
    mod.accepted_reduce_heads, mod.post_3606, mod.planner_revision = st.heads_ok, st.post_3606, st.revision
    compiled = {"mla_reduce_v1": _reduce_body}
    if ver >= PS_PREFILL_FIRST_VERSION:
        compiled.update(get_ps_metadata_v1=_planner_body, mla_prefill_ps_asm_fwd=_kernel_body)
        mod.get_ps_metadata_info_v1 = _op(st, "get_ps_metadata_info_v1", _info_body, plain=True)
    mod.aiter_op_namespace = f"aiter_standin_{next(_NAMESPACES)}"
    mod._torch_library = torch.library.Library(mod.aiter_op_namespace, "DEF")
    for name, body in compiled.items():
        mod._torch_library.define(name + _schema(_params(st, name)))
        setattr(mod, name, _op(st, name, body))
    return mod
