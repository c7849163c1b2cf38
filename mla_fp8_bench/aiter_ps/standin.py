"""A stand-in ``aiter`` module (docs/aiter-contract.md#standin): the four primitives as an AITER version shows them
(``(*args, **kwargs)`` ops with registered op schemas; the plain-Python info function), each validating like a
strict launcher, then running the planner port or the emulator. ``deferred``: the kernel and the reduce run as
on a GPU stream, at ``synchronize()``, reading their tensors (the plan buffers too) as they are then.
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

from mla_fp8_bench.aiter_ps import facts
from mla_fp8_bench.aiter_ps import planner as ps
from mla_fp8_bench.aiter_ps.emulator import EMULATOR, Emulator
from mla_fp8_bench.problem.shapes import QK_HEAD_DIM as _QK_DIM  # the kernel's hard-wired H*192 / H*128 strides
from mla_fp8_bench.problem.shapes import V_HEAD_DIM as _V_DIM

_FP8 = torch.float8_e4m3fn
_RAW = "no strides reach the kernel"


class StandinContractError(ValueError):
    """A call the real primitive would mishandle (garbage, a fault, memory corruption); names the argument."""


def _dt(d: torch.dtype) -> str:
    return str(d).replace("torch.", "")


def _summary(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        d: dict[str, Any] = {"shape": tuple(v.shape), "dtype": _dt(v.dtype), "device": str(v.device),
                             "contiguous": v.is_contiguous()}
        if v.numel() == 1 and v.dtype in (torch.float32, torch.int32) and v.device.type != "meta":
            d["value"] = v.item()
        return d
    return v if v is None or isinstance(v, (bool, int, float, str)) else repr(v)[:80]


class _Checker:
    """Argument checks of one primitive; each failure raises StandinContractError naming the function."""

    def __init__(self, fn: str) -> None:
        self.fn = fn

    def fail(self, msg: str) -> None:
        raise StandinContractError(f"{self.fn}: {msg}")

    def array(self, name: str, t: Any, dtypes: tuple[torch.dtype, ...], want: str | None, why: str = "",
              contiguous: str | None = None) -> torch.Tensor:
        """A tensor of ``dtypes`` and the rank of ``want`` (``"[R, H]"``; None: any); contiguous if ``contiguous``."""
        if t is None:
            self.fail(f"{name} is None: the real binding dereferences it unconditionally")
        if not isinstance(t, torch.Tensor):
            self.fail(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in dtypes:
            self.fail(f"{name} has dtype {_dt(t.dtype)}: must be {' or '.join(map(_dt, dtypes))}{why}")
        if want is not None and t.dim() != want.count(",") + 1:
            self.fail(f"{name} has shape {tuple(t.shape)}: must be {want}")
        if contiguous is not None and not t.is_contiguous():
            self.fail(f"{name} is not contiguous (strides {tuple(t.stride())}): {contiguous}")
        return t

    def ints(self, name: str, t: Any, cols: int | None = None) -> torch.Tensor:
        """A contiguous int32 tensor, 1-D or ``[n, cols]``."""
        t = self.array(name, t, (torch.int32,), "[n]" if cols is None else f"[n, {cols}]",
                       " (the binding reads int32)", "read as raw contiguous int32 memory")
        if cols is not None and t.shape[1] != cols:
            self.fail(f"{name} has shape {tuple(t.shape)}: must be [n, {cols}]")
        return t

    def py(self, name: str, v: Any, typ: type) -> Any:
        if isinstance(v, bool) is not (typ is bool) or not isinstance(v, typ):
            self.fail(f"{name} must be a {'Python int' if typ is int else typ.__name__}, got {type(v).__name__}"
                      f" {_summary(v)!r:.60}")
        return v

    def indptr(self, name: str, t: Any) -> list[int]:
        """An int32 indptr's values (``[B+1]``, from 0, non-decreasing)."""
        vals = self.ints(name, t).tolist()
        if len(vals) < 2 or vals[0] != 0 or vals != sorted(vals):
            self.fail(f"{name} must start at 0 and be non-decreasing with B+1 >= 2 entries, got {vals[:8]}")
        return vals

    def devices(self, a: dict[str, Any], names: tuple[str, ...], dev: torch.device, of: str) -> None:
        if bad := next((n for n in names if a[n] is not None and a[n].device != dev), None):
            self.fail(f"{bad} is on {a[bad].device}: every tensor must be on {of}'s device {dev}")


@dataclass
class _State:
    """What one stand-in module emulates, its call log and (``deferred``) its stream of pending launches."""

    cu_num: int
    version: tuple[int, int, int]
    variant: int
    heads_ok: tuple[int, ...]
    emulator: Emulator
    revision: str
    deferred: bool = False
    calls: list[dict[str, Any]] = field(default_factory=list)
    stream: list[Callable[[], None]] = field(default_factory=list)

    post_3606 = property(lambda self: self.revision != facts.PLANNER_PRE_3606)  # the reduce merges groups of one

    def record(self, name: str, args: dict[str, Any], body: Callable[[], Any], device: bool) -> Any:
        """Log the call and run ``body``; a ``device`` op of a deferred module at :meth:`synchronize`."""
        entry = {"name": name, "args": {k: _summary(v) for k, v in args.items()}, "ok": None, "error": None}
        self.calls.append(entry)

        def run() -> Any:
            try:
                out, entry["ok"] = body(), True
                return out
            except Exception as exc:
                entry["ok"], entry["error"] = False, f"{type(exc).__name__}: {exc}"
                raise

        return self.stream.append(run) if device and self.deferred else run()

    def synchronize(self) -> None:
        """Run the pending launches in order; a violation raises here (a GPU fault surfaces at a sync)."""
        pending, self.stream[:] = list(self.stream), []
        for run in pending:
            run()


def _info_body(st: _State, a: dict[str, Any]) -> list[tuple[Any, torch.dtype]]:
    """Six ``(shape, dtype)`` pairs at ``st.cu_num``, 1-D sizes as bare ints as in ``aiter/ops/attention.py``."""
    ck = _Checker("get_ps_metadata_info_v1")
    for k in ("batch_size", "num_head_k", "max_qlen", "qlen_granularity", "kvlen_granularity", "max_kvlen"):
        if a.get(k) is not None:
            ck.py(k, a[k], int)
    extra = {k: a[k] for k in ("max_kvlen", "kvlen_granularity", "total_qlen") if k in a}
    try:
        info = ps.ps_metadata_info(a["batch_size"], a["num_head_k"], a["max_qlen"], a["qlen_granularity"],
                                   cu_num=st.cu_num, revision=st.revision, **extra)
    except ps.PsPlanError as exc:
        ck.fail(str(exc))
    return [(int(shape[0]) if len(shape) == 1 else tuple(shape), getattr(torch, dt)) for shape, dt in info.values()]


def _planner_body(st: _State, a: dict[str, Any]) -> None:
    """Validate, plan with the port (this revision's semantics) and fill the six buffers in place."""
    ck = _Checker("get_ps_metadata_v1")
    qo, kv = ck.indptr("seqlens_qo_indptr", a["seqlens_qo_indptr"]), ck.indptr("pages_kv_indptr", a["pages_kv_indptr"])
    ctx = ck.ints("context_lens", a["context_lens"]).tolist()
    if ck.py("block_size", a["block_size"], int) != 1:
        ck.fail(f"block_size={a['block_size']}: the PS prefill runs at page size 1")
    if (kg := ck.py("kvlen_granularity", a["kvlen_granularity"], int)) != max(facts.KV_TILE, a["block_size"]):
        ck.fail(f"kvlen_granularity={kg}: must be max(128, block_size)=128, passed explicitly (the binding's real"
                " default is 1, the stub shows 16)")
    causal = ck.py("is_causal", a["is_causal"], bool)
    need_lse = ck.py("need_lse", a["need_lse"], bool) if "need_lse" in a else None
    if not isinstance(wmp := a["work_metadata_ptrs"], torch.Tensor) or wmp.numel() < 2:
        ck.fail(f"work_metadata_ptrs is {_summary(wmp)}: must be a uint64 [2] tensor")
    if (n := ck.ints("work_indptr", a["work_indptr"]).numel()) != st.cu_num + 1:
        ck.fail(f"work_indptr has {n} entries: must be cu_num+1 = {st.cu_num + 1} (size buffers on this device)")
    try:
        plan = ps.plan_ps_prefill(qo, kv, ctx, num_heads_k=a["num_heads_k"], cu_num=st.cu_num, gqa_ratio=a["gqa_ratio"],
                                  qhead_granularity=a["qhead_granularity"], qlen_granularity=a["qlen_granularity"],
                                  kvlen_granularity=kg, is_causal=causal, revision=st.revision, need_lse=need_lse)
    except ps.PsPlanError as exc:
        ck.fail(f"invalid planner input: {exc}")
    ng = plan.num_reduce_groups  # the real planner writes without bounds checks
    for name, cols, need in (("work_info", facts.WORK_INFO_COLS, plan.num_works), ("reduce_indptr", None, ng + 1),
                             ("reduce_final_map", 2, ng), ("reduce_partial_map", None, plan.num_partials)):
        if (have := ck.ints(name, a[name], cols).shape[0]) < need:
            unit = "entries" if cols is None else "rows"
            ck.fail(f"{name} is undersized: {have} {unit} < {need} needed by this plan (the real planner corrupts"
                    " host memory)")
    ps.fill_aiter_buffers(plan, *(a[n] for n in facts.BUFFER_NAMES))


def _check_kernel_tensors(ck: _Checker, a: dict[str, Any]) -> tuple[int, int]:
    """Q/K/V, the partials, the output and the scales as the kernel reads them, on Q's device; ``(T, H)``."""
    for name, d in (("Q", _QK_DIM), ("K", _QK_DIM), ("V", _V_DIM)):
        t = a[name]
        if isinstance(t, torch.Tensor) and t.dtype == torch.float8_e4m3fnuz:
            ck.fail(f"{name} is float8_e4m3fnuz (the gfx942 format, max 240): gfx950 needs float8_e4m3fn")
        ck.array(name, t, (_FP8,), f"[tokens, H, {d}]",
                 contiguous=_RAW + (" (V must be its own tensor, not a slice of K)" if name == "V" else ""))
        if t.shape[-1] != d:
            ck.fail(f"{name} head dim is {t.shape[-1]}: must be {d} (hard-wired H*{d} byte strides)")
    Q, K, V = a["Q"], a["K"], a["V"]
    T, H = int(Q.shape[0]), int(Q.shape[1])
    if K.shape[1] != H or V.shape[1] != H or K.shape[0] != V.shape[0]:
        ck.fail(f"head counts differ (H_q must equal H_kv) or pages: Q/K/V {[tuple(x.shape) for x in (Q, K, V)]}")
    if a["work_indptr"] is None:
        ck.fail("work_indptr is None: the grid is work_indptr.size(0)-1 with no null check")
    sd = ck.array("splitData", a["splitData"], (torch.float32,), f"[R, {H}, {_V_DIM}]", " (fp32 partials)", _RAW)
    sl = ck.array("splitLse", a["splitLse"], (torch.float32,), f"[R, {H}]", " (fp32 partial LSE)", _RAW)
    out = ck.array("output", a["output"], (torch.bfloat16,), f"[{T}, {H}, {_V_DIM}]",
                   " (the kernel packs bf16 itself)", _RAW)
    if tuple(sd.shape[1:]) != (H, _V_DIM) or tuple(sl.shape[1:]) != (H,) or sd.shape[0] != sl.shape[0]:
        ck.fail(f"splitData has {sd.shape[0]} rows but splitLse {sl.shape[0]}; shapes {tuple(sd.shape)} /"
                f" {tuple(sl.shape)} must be [R, {H}, {_V_DIM}] / [R, {H}]")
    if tuple(out.shape) != (T, H, _V_DIM):
        ck.fail(f"output has shape {tuple(out.shape)}: must be [{T}, {H}, {_V_DIM}]")
    for name in ("q_scale", "k_scale", "v_scale"):
        if a[name] is None:
            ck.fail(f"{name} is None: the kernel always reads the scale (pass 1.0 as a one-element fp32 device tensor)")
        if ck.array(name, a[name], (torch.float32,), None, " (one-element fp32 dequant multiplier)").numel() != 1 \
                or a[name].dim() > 1:
            ck.fail(f"{name} has shape {tuple(a[name].shape)}: must be [1] or [] (one fp32 element)")
        if a[name].device != Q.device:
            ck.fail(f"{name} is on {a[name].device}: must be a device tensor on {Q.device} like Q")
    ck.devices(a, ("K", "V", "qo_indptr", "kv_indptr", "kv_page_indices", "work_indptr", "work_info_set",
                   "splitData", "splitLse", "output"), Q.device, "Q")
    return T, H


def _kernel_body(st: _State, a: dict[str, Any]) -> None:
    """Validate like a strict launcher (works inside their sequences, heads and ``splitData``), then run the
    emulated kernel in place."""
    ck = _Checker("mla_prefill_ps_asm_fwd")
    T, H = _check_kernel_tensors(ck, a)
    ck.py("max_seqlen_q", a["max_seqlen_q"], int)
    if isinstance(sm := a["softmax_scale"], bool) or not isinstance(sm, (int, float)) or not math.isfinite(sm) \
            or sm <= 0:
        ck.fail(f"softmax_scale must be a Python float, finite and > 0, got {type(sm).__name__} {sm!r:.40}")
    causal = ck.py("is_causal", a["is_causal"], bool)
    qo, kvp = ck.indptr("qo_indptr", a["qo_indptr"]), ck.indptr("kv_indptr", a["kv_indptr"])
    pages, wi = ck.ints("kv_page_indices", a["kv_page_indices"]), ck.indptr("work_indptr", a["work_indptr"])
    winfo = ck.ints("work_info_set", a["work_info_set"], facts.WORK_INFO_COLS)
    if len(qo) != len(kvp) or qo[-1] > T or kvp[-1] > pages.numel():
        ck.fail(f"qo_indptr / kv_indptr ({len(qo)} / {len(kvp)} entries, ending at {qo[-1]} / {kvp[-1]}) must both be"
                f" B+1 long and fit Q's {T} rows / kv_page_indices' {pages.numel()} entries")
    if pages.numel() and (int(pages.min()) < 0 or int(pages.max()) >= a["K"].shape[0]):
        ck.fail(f"kv_page_indices has values outside [0, {a['K'].shape[0]}) (K/V pages)")
    if wi[-1] > winfo.shape[0]:
        ck.fail(f"work_indptr reaches work {wi[-1]} but work_info_set has {winfo.shape[0]} rows")
    need_rows, B = 0, len(qo) - 1
    for n, (b, loc, q0, q1, k0, k1, _off, hr) in enumerate(winfo[: wi[-1]].tolist()):
        h_lo, h_hi = facts.unpack_q_head_range(hr & 0xFFFFFFFF)
        if not (0 <= b < B and qo[b] <= q0 <= q1 <= qo[b + 1] and kvp[b] <= k0 <= k1 <= kvp[b + 1]
                and 0 <= h_lo < h_hi <= H):
            ck.fail(f"work {n}: batch {b}, rows [{q0},{q1}), kv [{k0},{k1}), heads [{h_lo},{h_hi}) outside the"
                    f" batch's {B} sequences or {H} heads (a memory fault on hardware)")
        if loc != -1 and (loc < 0 or loc % facts.Q_TILE):
            ck.fail(f"work {n}: partial_o_loc {loc} is not -1 or a multiple of {facts.Q_TILE}")
        need_rows = max(need_rows, loc + facts.Q_TILE if loc != -1 else 0)
    if causal and (b := next((b for b in range(B) if qo[b + 1] - qo[b] > kvp[b + 1] - kvp[b]), None)) is not None:
        ck.fail(f"sequence {b}: q_len {qo[b + 1] - qo[b]} > kv_len {kvp[b + 1] - kvp[b]}, causal (undefined)")
    if (rows := int(a["splitData"].shape[0])) < need_rows:
        ck.fail(f"splitData/splitLse have {rows} rows but the plan's partial slots need {need_rows} (256 each)")
    st.emulator.mla_prefill_ps_asm_fwd(*(a[k] for k in list(a)[:9]), float(sm), causal,
                                       *(a[k] for k in list(a)[11:]))


def _reduce_body(st: _State, a: dict[str, Any]) -> None:
    """Validate like a strict launcher, then run the emulated reduce in place."""
    ck, variant = _Checker("mla_reduce_v1"), st.variant
    po = ck.array("partial_output", a["partial_output"], (torch.float32,), "[R, H, dv]", " (fp32 partials)", _RAW)
    pl = ck.array("partial_lse", a["partial_lse"], (torch.float32,), "[R, H]", " (fp32 partial LSE)", _RAW)
    ri = ck.indptr("reduce_indptr", a["reduce_indptr"])
    fmap, pmap = ck.ints("reduce_final_map", a["reduce_final_map"], 2), ck.ints("reduce_partial_map", a[
        "reduce_partial_map"])
    for k in ("max_seqlen_q", "num_kv_splits"):
        if isinstance(a.get(k), torch.Tensor):
            ck.fail(f"{k} got a Tensor {tuple(a[k].shape)}: an int is expected there - a {variant - 1}-argument"
                    f" call puts final_output into this {variant}-argument binding's int slot (vLLM #46760)")
        if k in a:
            ck.py(k, a[k], int)
    fo = ck.array("final_output", a["final_output"], (torch.bfloat16, torch.float16), "[total_q, H, dv]")
    if fo.stride(-1) != 1:
        ck.fail(f"final_output's last dim is not contiguous (strides {tuple(fo.stride())})")
    H, dv = int(po.shape[-2]), int(fo.shape[-1])
    if tuple(pl.shape) != (po.shape[0], H) or fo.shape[-2] != H or po.shape[-1] != dv:
        ck.fail(f"partial_output {tuple(po.shape)}, partial_lse {tuple(pl.shape)} and final_output"
                f" {tuple(fo.shape)} disagree: must be [R, H, dv], [R, H], [total_q, H, dv]")
    if (fl := a["final_lse"]) is not None:
        ck.array("final_lse", fl, (torch.float32,), "[total_q, H]", contiguous="addressed as seq*H + head")
        if tuple(fl.shape) != (fo.shape[0], H):
            ck.fail(f"final_lse has shape {tuple(fl.shape)}: must be [total_q, H] = [{fo.shape[0]}, {H}]")
    ck.devices(a, ("partial_lse", "reduce_indptr", "reduce_final_map", "reduce_partial_map", "final_output",
                   "final_lse"), po.device, "partial_output")
    if len(ri) > 1 and (dv != _V_DIM or H not in st.heads_ok):
        ck.fail(f"doesn't support the specified settings: H={H}, dv={dv} (AITER {facts.format_version(st.version)}"
                f" dispatches dv=128 with H in {list(st.heads_ok)}, also when nothing was split)")
    locs = pmap[: ri[-1]].tolist()
    if ri[-1] > pmap.numel() or any(p < 0 for p in locs):
        ck.fail(f"reduce_indptr[-1]={ri[-1]} exceeds reduce_partial_map's {pmap.numel()} entries or a location is < 0")
    if po.shape[0] < (need := max(locs, default=-facts.Q_TILE) + facts.Q_TILE):
        ck.fail(f"partial_output/partial_lse have {po.shape[0]} rows but reduce_partial_map needs {need}")
    live = [g for g in range(len(ri) - 1) if ri[g + 1] - ri[g] >= (1 if st.post_3606 else 2)]
    if live and max(live) >= fmap.shape[0]:
        ck.fail(f"reduce_final_map has {fmap.shape[0]} rows but group {max(live)} is live")
    for g in live:
        q0, q1 = int(fmap[g, 0]), int(fmap[g, 1])
        if not (0 <= q0 <= q1 <= fo.shape[0] and q1 - q0 <= facts.Q_TILE):
            ck.fail(f"reduce_final_map row {g} is [{q0}, {q1}): a group's rows must satisfy 0 <= q0 <= q1 <="
                    f" total_q={fo.shape[0]} and q1 - q0 <= {facts.Q_TILE} (one partial slot)")
    st.emulator.mla_reduce_v1(po, pl, a["reduce_indptr"], fmap, pmap, fo, fl, post_3606=st.post_3606)


# parameters, opaque wrappers and registered schemas (as AITER's compile_ops / torch_compile_guard expose them)

_T, _TM, _TO, _I, _F, _B = "Tensor", "Tensor(a!)", "Tensor?", "SymInt", "float", "bool"
_PARAMS: dict[str, list[tuple]] = {  # (name, schema type[, default]) as in AITER's Python stubs; see _params
    "get_ps_metadata_info_v1": [("batch_size", _I), ("num_head_k", _I), ("max_qlen", _I),
                                ("qlen_granularity", _I, 256)],
    "get_ps_metadata_v1": [
        ("seqlens_qo_indptr", _T), ("pages_kv_indptr", _T), ("context_lens", _T), ("gqa_ratio", _I),
        ("num_heads_k", _I), *((name, _TM) for name in facts.BUFFER_NAMES), ("qhead_granularity", _I, 1),
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
    if name == "get_ps_metadata_v1" and st.revision in facts.NEED_LSE_REVISIONS:
        params.append(("need_lse", _B, False))
    if name == "get_ps_metadata_info_v1" and st.revision == facts.PLANNER_PR_3606_REF:
        params += [("max_kvlen", _I, None), ("kvlen_granularity", _I, 128)]
    if name == "get_ps_metadata_info_v1" and st.revision == facts.PLANNER_TOTAL_QLEN:
        params.append(("total_qlen", _I, None))
    if name == "mla_reduce_v1":
        params[5:5] = [("max_seqlen_q", _I), ("num_kv_splits", _I)][: st.variant - 7]
    return params


def _op(st: _State, name: str, body: Callable[[_State, dict[str, Any]], Any], plain: bool = False) -> Callable:
    """``name`` as AITER hands it out: a ``(*args, **kwargs)`` wrapper (``plain``: with a Python signature) that
    binds its arguments as a Python call would, records the call and runs ``body``."""
    defaults = _CALL_DEFAULTS.get(name, {})
    sig = inspect.Signature([
        inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                          default=defaults.get(p, d[0]) if d else inspect.Parameter.empty)
        for p, _typ, *d in _params(st, name)])

    def wrapper(*args, **kwargs):
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{name}() {exc}") from None
        bound.apply_defaults()
        a = dict(bound.arguments)
        return st.record(name, a, lambda: body(st, a), device=name in ("mla_prefill_ps_asm_fwd", "mla_reduce_v1"))

    wrapper.__name__ = wrapper.__qualname__ = name
    wrapper.__module__ = "aiter"
    wrapper.__doc__ = f"Stand-in of ``aiter.{name}``: validates (StandinContractError), then emulates it."
    if plain:
        wrapper.__signature__ = sig
    return wrapper


def make_standin_aiter(
    *, reduce_variant: int | None = None, cu_num: int = 256, emulator: Emulator | None = None,
    aiter_version: Any = facts.NEWEST_MODELLED_VERSION, planner_revision: str | None = None, deferred: bool = False,
) -> types.ModuleType:
    """A stand-in ``aiter`` package module (not in ``sys.modules``) emulating AITER ``aiter_version`` (below 0.1.10
    only ``mla_reduce_v1``) at ``cu_num`` CUs, ``reduce_variant`` and ``planner_revision`` overridable; besides
    the primitives it carries ``calls`` (one ``{"name", "args", "ok", "error"}`` per call), ``synchronize`` and
    what it emulates. ValueError for a bad variant, ``cu_num``, version or revision."""
    ver = facts.parse_aiter_version(aiter_version)
    revision = facts.planner_revision_for(ver) if planner_revision is None else planner_revision
    if revision not in facts.PLANNER_REVISIONS:
        raise ValueError(f"planner_revision={planner_revision!r} is unknown: allowed {facts.PLANNER_REVISIONS}")
    variant = facts.reduce_arity_for_version(ver) if reduce_variant is None else reduce_variant
    if variant not in (7, 8, 9) or isinstance(variant, bool):
        raise ValueError(f"reduce_variant={reduce_variant!r} is invalid: must be 7, 8, 9 or None")
    if isinstance(cu_num, bool) or not isinstance(cu_num, int) or cu_num < 1:
        raise ValueError(f"cu_num={cu_num!r} is invalid: must be an int >= 1")
    st = _State(cu_num=cu_num, version=ver, variant=variant, heads_ok=tuple(sorted(facts.reduce_heads_for(ver))),
                emulator=emulator or EMULATOR, revision=revision, deferred=deferred)
    mod = types.ModuleType("aiter", "Stand-in aiter (mla_fp8_bench.aiter_ps.standin): emulated, CPU-only.")
    mod.__dict__.update(
        __spec__=importlib.machinery.ModuleSpec("aiter", None, is_package=True), __path__=[],
        __version__=facts.format_version(ver), is_standin=True, StandinContractError=StandinContractError,
        calls=st.calls, synchronize=st.synchronize, cu_num=cu_num, aiter_version=ver, reduce_variant=variant,
        accepted_reduce_heads=st.heads_ok, post_3606=st.post_3606, planner_revision=st.revision)
    compiled = {"mla_reduce_v1": _reduce_body}
    if ver >= facts.PS_PREFILL_FIRST_VERSION:
        compiled.update(get_ps_metadata_v1=_planner_body, mla_prefill_ps_asm_fwd=_kernel_body)
        mod.get_ps_metadata_info_v1 = _op(st, "get_ps_metadata_info_v1", _info_body, plain=True)
    mod.aiter_op_namespace = f"aiter_standin_{next(_NAMESPACES)}"
    mod._torch_library = torch.library.Library(mod.aiter_op_namespace, "DEF")
    for name, body in compiled.items():
        params = _params(st, name)
        parts = [f"{typ.replace('(a!)', f'(a{i}!)')} {p}" + (f"={d[0]}" if d else "")
                 for i, (p, typ, *d) in enumerate(params)]
        mod._torch_library.define(f"{name}({', '.join(parts)}) -> ()")
        setattr(mod, name, _op(st, name, body))
    return mod
