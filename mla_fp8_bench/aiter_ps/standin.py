"""A stand-in ``aiter`` module for CPU contract tests of code that drives AITER's PS FP8 MLA prefill.

:func:`make_standin_aiter` builds a module object named ``"aiter"`` (a package: ``__path__ = []``,
``__spec__`` set) that exposes the four primitives a backend calls, with the real Python parameter
names and defaults (contract doc §3; AITER main ``e4048607a535``), so ``inspect.signature`` feature
detection (§2) sees what it would see on a real install of the emulated version:

* ``get_ps_metadata_info_v1(batch_size, num_head_k, max_qlen, qlen_granularity=256)``
* ``get_ps_metadata_v1(seqlens_qo_indptr, pages_kv_indptr, context_lens, gqa_ratio, num_heads_k,
  work_metadata_ptrs, work_indptr, work_info, reduce_indptr, reduce_final_map, reduce_partial_map,
  qhead_granularity=1, qlen_granularity=256, kvlen_granularity=1, block_size=1, is_causal=True)``
  (the binding's real defaults ``1, 1``, not the stub's ``16, 16``; §3.2)
* ``mla_prefill_ps_asm_fwd(Q, K, V, qo_indptr, kv_indptr, kv_page_indices, work_indptr,
  work_info_set, max_seqlen_q, softmax_scale, is_causal, splitData, splitLse, output,
  q_scale=None, k_scale=None, v_scale=None)`` (§3.3)
* ``mla_reduce_v1`` in its 7-, 8- or 9-argument form (§3.4).

Unlike the real primitives (which check almost nothing and fail with garbage, faults or memory
corruption), every stand-in validates like a strict launcher and raises :class:`StandinContractError`
(a ``ValueError``) naming what the real one would mishandle. Valid calls delegate to the pure-Python
planner port (:mod:`.planner`) and to the emulator (:mod:`.emulator`), so results are those of
:func:`mla_fp8_bench.aiter_ps.emulator.run_emulated_prefill`. Every call is recorded in
``module.calls``.

Never import the real ``aiter`` here: this module is for machines without ROCm.
"""

from __future__ import annotations

import importlib.machinery
import math
import re
import types
from collections.abc import Callable, Iterable
from typing import Any

import torch

from mla_fp8_bench.aiter_ps.emulator import (
    KV_TILE,
    QO_TILE,
    emulate_mla_prefill_ps_asm_fwd,
    emulate_mla_reduce_v1,
    normalize_faults,
)

__all__ = [
    "StandinContractError",
    "make_standin_aiter",
    "accepted_reduce_heads",
    "reduce_variant_for_version",
    "DEFAULT_AITER_VERSION",
    "PS_PREFILL_FIRST_VERSION",
]

#: AITER version emulated by default (the newest tag at the reference commit is v0.1.20.post1).
DEFAULT_AITER_VERSION = (0, 1, 20)
#: First version with the PS prefill primitives (tag v0.1.10.post1; ``(0, 1, 10)`` is taken to mean it).
PS_PREFILL_FIRST_VERSION = (0, 1, 10)

_QK_DIM = 192
_V_DIM = 128
_FP8 = torch.float8_e4m3fn

# Head counts accepted by mla_reduce_v1 for dv=128, by version (contract §3.4).
_REDUCE_HEADS_STEPS = (
    ((0, 0, 0), (1, 2, 4, 8, 10, 16, 128)),  # v0.1.10.post1 (assumed for older versions too)
    ((0, 1, 11), (32, 64)),
    ((0, 1, 12), (40,)),
    ((0, 1, 20), (48, 96)),
)


class StandinContractError(ValueError):
    """A call the real AITER primitive would mishandle (garbage, GPU fault, memory corruption or a
    dispatch error). The message names the argument and the contract (doc section)."""


def _parse_version(v: Any) -> tuple[int, ...]:
    if isinstance(v, str):
        nums = re.findall(r"\d+", v.split("+")[0])
        v = tuple(int(x) for x in nums[:3])
    try:
        out = tuple(int(x) for x in v)
    except TypeError as exc:
        raise ValueError(f"aiter_version must be a tuple of ints like (0, 1, 20), got {v!r}") from exc
    if len(out) < 3:
        raise ValueError(f"aiter_version must have at least 3 components (major, minor, patch), got {v!r}")
    return out[:3]


def accepted_reduce_heads(aiter_version: tuple = DEFAULT_AITER_VERSION) -> tuple[int, ...]:
    """Head counts ``mla_reduce_v1`` dispatches for dv=128 at ``aiter_version`` (contract §3.4).

    v0.1.10.post1: 1, 2, 4, 8, 10, 16, 128; v0.1.11 adds 32, 64; v0.1.12 adds 40; v0.1.20 adds 48,
    96. Older versions are given the v0.1.10.post1 list (not documented further back).
    """
    ver = _parse_version(aiter_version)
    heads: set[int] = set()
    for since, hs in _REDUCE_HEADS_STEPS:
        if ver >= since:
            heads.update(hs)
    return tuple(sorted(heads))


def reduce_variant_for_version(aiter_version: tuple = DEFAULT_AITER_VERSION) -> int:
    """Argument count of ``mla_reduce_v1`` at ``aiter_version``: 7 (<= 0.1.7), 8 (0.1.8 .. 0.1.15.x)
    or 9 (>= 0.1.16, ROCm/aiter#3391). Contract §3.4."""
    ver = _parse_version(aiter_version)
    if ver >= (0, 1, 16):
        return 9
    if ver >= (0, 1, 8):
        return 8
    return 7


# ----------------------------------------------------------------------------------------------
# argument checks (each raises StandinContractError naming fn + argument)


def _summary(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        d: dict[str, Any] = {
            "shape": tuple(int(s) for s in v.shape),
            "dtype": str(v.dtype).replace("torch.", ""),
            "device": str(v.device),
            "contiguous": bool(v.is_contiguous()),
        }
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

    def contiguous(self, name: str, t: torch.Tensor, why: str = "no strides reach the kernel") -> None:
        if not t.is_contiguous():
            self.fail(f"{name} is not contiguous (strides {tuple(t.stride())}): {why}")

    def ndim(self, name: str, t: torch.Tensor, n: int, want: str) -> None:
        if t.dim() != n:
            self.fail(f"{name} has shape {tuple(t.shape)}: must be {want}")

    def int_vec(self, name: str, t: Any, what: str = "int32 1-D") -> torch.Tensor:
        t = self.tensor(name, t)
        self.dtype(name, t, torch.int32, why=" (the binding reads int32)")
        self.ndim(name, t, 1, what)
        self.contiguous(name, t, "read as raw contiguous int32 memory")
        return t

    def int_mat(self, name: str, t: Any, cols: int) -> torch.Tensor:
        t = self.tensor(name, t)
        self.dtype(name, t, torch.int32, why=" (the binding reads int32)")
        self.ndim(name, t, 2, f"[n, {cols}] int32")
        if t.shape[1] != cols:
            self.fail(f"{name} has shape {tuple(t.shape)}: must be [n, {cols}] int32")
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

    def indptr(self, name: str, t: torch.Tensor) -> list[int]:
        vals = t.tolist()
        if len(vals) < 2:
            self.fail(f"{name} has {len(vals)} entries: needs B+1 >= 2")
        if vals[0] != 0 or any(b < a for a, b in zip(vals, vals[1:])):
            self.fail(f"{name} must start at 0 and be non-decreasing, got {vals[:8]}")
        return vals

    def scale(self, name: str, t: Any, device: torch.device) -> None:
        if t is None:
            self.fail(
                f"{name} is None: the kernel always reads the scale, a null dereference on hardware "
                "(pass a one-element fp32 device tensor, 1.0 for unit scale; contract §3.3)"
            )
        t = self.tensor(name, t)
        self.dtype(name, t, torch.float32, why=" (one-element fp32 dequant multiplier)")
        if t.numel() != 1 or t.dim() > 1:
            self.fail(f"{name} has shape {tuple(t.shape)}: must be [1] or [] (one fp32 element)")
        if t.device != device:
            self.fail(f"{name} is on {t.device}: must be a device tensor on {device} like Q")


# ----------------------------------------------------------------------------------------------
# factory


def make_standin_aiter(
    *,
    reduce_variant: int | None = None,
    cu_num: int = 256,
    faults: Iterable[str] | str | None = None,
    aiter_version: tuple = DEFAULT_AITER_VERSION,
) -> types.ModuleType:
    """Build a stand-in ``aiter`` module (CPU; backed by the planner port and the emulator).

    Source: contract doc §2 (feature markers), §3.1-§3.4 (signatures, contracts), §4 (limits);
    AITER ``e4048607a535`` (``aiter/ops/attention.py``, ``csrc/py_itfs_cu/asm_mla.cu``,
    ``csrc/kernels/mla/reduce.cu``).

    Args:
        reduce_variant: 7, 8 or 9 - the ``mla_reduce_v1`` form to expose. ``None`` (default) derives
            it from ``aiter_version`` (9 for the default 0.1.20); an explicit value overrides the
            version (to model a mixed install).
        cu_num: the device CU count the planner and the info call read (256 on MI355X).
        faults: fault names from :data:`mla_fp8_bench.aiter_ps.emulator.ALL_FAULTS`, injected into
            the emulated kernel/reduce.
        aiter_version: emulated AITER version ``(major, minor, patch)`` (or ``"0.1.20"``): sets the
            accepted reduce head counts (:func:`accepted_reduce_heads`), the default reduce variant
            and, below ``(0, 1, 10)``, leaves out the PS prefill symbols (only ``mla_reduce_v1``).

    Returns:
        A ``types.ModuleType`` named ``"aiter"`` (``__spec__`` a package spec, ``__path__ == []``,
        ``__version__``) with the primitives, ``StandinContractError``, ``calls`` (list of
        ``{"name", "args", "ok", "error"}`` dicts, one per call, args summarised as shapes, dtypes,
        devices, contiguity and scalar values), and the attributes ``cu_num``, ``aiter_version``,
        ``reduce_variant``, ``accepted_reduce_heads``, ``faults``, ``is_standin = True``.
        It is not inserted into ``sys.modules``: tests do that (e.g. ``monkeypatch.setitem``).

    Raises:
        ValueError: ``reduce_variant`` not in {7, 8, 9}, ``cu_num < 1``, a malformed version, or an
            unknown fault name.
    """
    ver = _parse_version(aiter_version)
    variant = reduce_variant_for_version(ver) if reduce_variant is None else reduce_variant
    if variant not in (7, 8, 9) or isinstance(variant, bool):
        raise ValueError(f"reduce_variant={reduce_variant!r} is invalid: must be 7, 8, 9 or None")
    if isinstance(cu_num, bool) or not isinstance(cu_num, int) or cu_num < 1:
        raise ValueError(f"cu_num={cu_num!r} is invalid: must be an int >= 1")
    fs = normalize_faults(faults)
    heads_ok = accepted_reduce_heads(ver)
    has_ps = ver >= PS_PREFILL_FIRST_VERSION

    mod = types.ModuleType("aiter", "Stand-in aiter (mla_fp8_bench.aiter_ps.standin): emulated, CPU-only.")
    mod.__spec__ = importlib.machinery.ModuleSpec("aiter", None, is_package=True)
    mod.__path__ = []
    mod.__version__ = ".".join(str(x) for x in ver)
    mod.is_standin = True
    mod.StandinContractError = StandinContractError
    mod.calls = []
    mod.cu_num = cu_num
    mod.aiter_version = ver
    mod.reduce_variant = variant
    mod.accepted_reduce_heads = heads_ok
    mod.faults = fs

    def _record(name: str, args: dict[str, Any], body: Callable[[], Any]) -> Any:
        entry = {"name": name, "args": {k: _summary(v) for k, v in args.items()}, "ok": None, "error": None}
        mod.calls.append(entry)
        try:
            out = body()
        except Exception as exc:
            entry["ok"], entry["error"] = False, f"{type(exc).__name__}: {exc}"
            raise
        entry["ok"] = True
        return out

    # ---- get_ps_metadata_info_v1 -------------------------------------------------------------
    def get_ps_metadata_info_v1(batch_size, num_head_k, max_qlen, qlen_granularity=256):
        """Stand-in of ``aiter.get_ps_metadata_info_v1`` (contract §3.1): six ``(shape, dtype)``
        pairs (work_metadata_ptrs, work_indptr, work_info, reduce_indptr, reduce_final_map,
        reduce_partial_map) at this module's ``cu_num``. Raises StandinContractError on bad ints."""
        args = dict(batch_size=batch_size, num_head_k=num_head_k, max_qlen=max_qlen, qlen_granularity=qlen_granularity)

        def body():
            from mla_fp8_bench.aiter_ps.planner import ps_metadata_info

            ck = _Checker("get_ps_metadata_info_v1")
            for k, v in args.items():
                if ck.py_int(k, v) < (1 if k in ("num_head_k", "qlen_granularity") else 0):
                    ck.fail(f"{k}={v} is out of range")
            info = ps_metadata_info(batch_size, num_head_k, max_qlen, qlen_granularity, cu_num=cu_num)
            # like the real function: 1-D sizes are bare ints, 2-D shapes are tuples (aiter/ops/attention.py)
            return [(int(shape[0]) if len(shape) == 1 else tuple(shape), getattr(torch, dt))
                    for shape, dt in info.values()]

        return _record("get_ps_metadata_info_v1", args, body)

    # ---- get_ps_metadata_v1 --------------------------------------------------------------------
    def get_ps_metadata_v1(
        seqlens_qo_indptr,
        pages_kv_indptr,
        context_lens,
        gqa_ratio,
        num_heads_k,
        work_metadata_ptrs,
        work_indptr,
        work_info,
        reduce_indptr,
        reduce_final_map,
        reduce_partial_map,
        qhead_granularity=1,
        qlen_granularity=256,
        kvlen_granularity=1,
        block_size=1,
        is_causal=True,
    ):
        """Stand-in of ``aiter.get_ps_metadata_v1`` (contract §3.2, §6): validates, plans with the
        port and fills the six buffers in place (whole buffers, zero tails). Returns None.
        Raises StandinContractError for non-int32/non-contiguous inputs, unsupported granularities
        (including the binding defaults kvlen_granularity=1/block_size=1 left implicit), a
        work_indptr not sized cu_num+1, or buffers too small for the plan."""
        args = dict(
            seqlens_qo_indptr=seqlens_qo_indptr, pages_kv_indptr=pages_kv_indptr, context_lens=context_lens,
            gqa_ratio=gqa_ratio, num_heads_k=num_heads_k, work_metadata_ptrs=work_metadata_ptrs,
            work_indptr=work_indptr, work_info=work_info, reduce_indptr=reduce_indptr,
            reduce_final_map=reduce_final_map, reduce_partial_map=reduce_partial_map,
            qhead_granularity=qhead_granularity, qlen_granularity=qlen_granularity,
            kvlen_granularity=kvlen_granularity, block_size=block_size, is_causal=is_causal,
        )  # fmt: skip

        def body():
            from mla_fp8_bench.aiter_ps.planner import PsPlanError, fill_aiter_buffers, plan_ps_prefill

            ck = _Checker("get_ps_metadata_v1")
            qo = ck.indptr("seqlens_qo_indptr", ck.int_vec("seqlens_qo_indptr", seqlens_qo_indptr))
            kv = ck.indptr("pages_kv_indptr", ck.int_vec("pages_kv_indptr", pages_kv_indptr))
            ctx = ck.int_vec("context_lens", context_lens).tolist()
            if len(kv) != len(qo) or len(ctx) != len(qo) - 1:
                ck.fail(
                    f"lengths disagree: seqlens_qo_indptr {len(qo)}, pages_kv_indptr {len(kv)} (need B+1), "
                    f"context_lens {len(ctx)} (need B)"
                )
            if ck.py_int("gqa_ratio", gqa_ratio) != 1:
                ck.fail(f"gqa_ratio={gqa_ratio}: the PS prefill kernel exists only for gqa_ratio=1 (MHA)")
            if ck.py_int("num_heads_k", num_heads_k) < 1:
                ck.fail(f"num_heads_k={num_heads_k} must be >= 1")
            if ck.py_int("qhead_granularity", qhead_granularity) != 1:
                ck.fail(f"qhead_granularity={qhead_granularity}: must be 1 (one head per work)")
            if ck.py_int("qlen_granularity", qlen_granularity) != QO_TILE:
                ck.fail(f"qlen_granularity={qlen_granularity}: must be {QO_TILE} (the kernel's q-tile)")
            bs = ck.py_int("block_size", block_size)
            if bs != 1:
                ck.fail(f"block_size={bs}: the PS prefill runs at page size 1 (contract §4)")
            kg = ck.py_int("kvlen_granularity", kvlen_granularity)
            if kg != max(KV_TILE, bs):
                ck.fail(
                    f"kvlen_granularity={kg}: must be max(128, block_size)=128, passed explicitly - the "
                    "binding's real default is 1 (the stub shows 16), which plans KV splits off the "
                    "kernel's 128-key tiles (contract §3.2)"
                )
            causal = ck.py_bool("is_causal", is_causal)
            ck.tensor("work_metadata_ptrs", work_metadata_ptrs)
            if work_metadata_ptrs.numel() < 2:
                ck.fail(f"work_metadata_ptrs has {work_metadata_ptrs.numel()} elements: must be uint64 [2]")
            wi = ck.int_vec("work_indptr", work_indptr)
            if wi.numel() != cu_num + 1:
                ck.fail(
                    f"work_indptr has {wi.numel()} entries: must be cu_num+1 = {cu_num + 1} for this "
                    f"device ({cu_num} CUs); size buffers with get_ps_metadata_info_v1 on the same device "
                    "(no CU masking, contract §4)"
                )
            ck.int_mat("work_info", work_info, 8)
            ck.int_vec("reduce_indptr", reduce_indptr)
            ck.int_mat("reduce_final_map", reduce_final_map, 2)
            ck.int_vec("reduce_partial_map", reduce_partial_map)
            try:
                plan = plan_ps_prefill(
                    qo, kv, ctx, num_heads_k=num_heads_k, cu_num=cu_num, gqa_ratio=1, qhead_granularity=1,
                    qlen_granularity=QO_TILE, kvlen_granularity=kg, block_size=bs, is_causal=causal,
                )  # fmt: skip
            except PsPlanError as exc:
                ck.fail(f"invalid planner input: {exc}")
            sizes = {
                "work_info": (work_info.shape[0], plan.num_works),
                "reduce_indptr": (reduce_indptr.numel(), plan.num_reduce_groups + 1),
                "reduce_final_map": (reduce_final_map.shape[0], plan.num_reduce_groups),
                "reduce_partial_map": (reduce_partial_map.numel(), plan.num_partials),
            }
            for name, (have, need) in sizes.items():
                if have < need:
                    unit = "rows" if name in ("work_info", "reduce_final_map") else "entries"
                    ck.fail(
                        f"{name} is undersized: {have} {unit} < {need} needed by this plan; the real "
                        "planner writes past it without bounds "
                        "checks and corrupts host memory (size with get_ps_metadata_info_v1, contract §3.2)"
                    )
            fill_aiter_buffers(
                plan, work_metadata_ptrs, work_indptr, work_info, reduce_indptr, reduce_final_map, reduce_partial_map
            )
            return None

        return _record("get_ps_metadata_v1", args, body)

    # ---- mla_prefill_ps_asm_fwd ----------------------------------------------------------------
    def mla_prefill_ps_asm_fwd(
        Q,
        K,
        V,
        qo_indptr,
        kv_indptr,
        kv_page_indices,
        work_indptr,
        work_info_set,
        max_seqlen_q,
        softmax_scale,
        is_causal,
        splitData,
        splitLse,
        output,
        q_scale=None,
        k_scale=None,
        v_scale=None,
    ):
        """Stand-in of ``aiter.mla_prefill_ps_asm_fwd`` (contract §3.3, §4, §7): validates like a
        strict launcher, then runs the emulated kernel in place. Returns None.
        Raises StandinContractError for: Q/K/V not contiguous float8_e4m3fn ``[T, H, 192/192/128]``
        with equal H; non-int32 or non-contiguous indptrs / page indices / work buffers;
        ``work_indptr`` None; page indices out of range; splitData/splitLse not fp32 ``[R, H, 128]``
        / ``[R, H]`` with R covering every partial slot of the plan; output not bf16
        ``[T, H, 128]``; scales None or not one-element fp32 tensors; 32-bit buffer limits exceeded;
        works outside their sequence; causal with q_len > kv_len."""
        args = dict(
            Q=Q, K=K, V=V, qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_page_indices=kv_page_indices,
            work_indptr=work_indptr, work_info_set=work_info_set, max_seqlen_q=max_seqlen_q,
            softmax_scale=softmax_scale, is_causal=is_causal, splitData=splitData, splitLse=splitLse,
            output=output, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale,
        )  # fmt: skip

        def body():
            ck = _Checker("mla_prefill_ps_asm_fwd")
            for name, t, d in (("Q", Q, _QK_DIM), ("K", K, _QK_DIM), ("V", V, _V_DIM)):
                ck.tensor(name, t)
                if t.dtype == torch.float8_e4m3fnuz:
                    ck.fail(f"{name} is float8_e4m3fnuz (the gfx942 format, max 240): gfx950 needs float8_e4m3fn")
                ck.dtype(name, t, _FP8)
                ck.ndim(name, t, 3, f"[tokens, H, {d}]")
                if t.shape[-1] != d:
                    ck.fail(f"{name} head dim is {t.shape[-1]}: must be {d} (hard-wired H*{d} byte strides)")
                why = "no strides reach the kernel"
                ck.contiguous(name, t, why + (" (V must be its own tensor, not a slice of K)" if name == "V" else ""))
            T, H = int(Q.shape[0]), int(Q.shape[1])
            if K.shape[1] != H or V.shape[1] != H:
                ck.fail(f"head counts differ: Q {H}, K {K.shape[1]}, V {V.shape[1]} (H_q must equal H_kv)")
            if K.shape[0] != V.shape[0]:
                ck.fail(f"K has {K.shape[0]} pages but V has {V.shape[0]}")
            dev = Q.device
            for name, t in (("K", K), ("V", V)):
                if t.device != dev:
                    ck.fail(f"{name} is on {t.device}, Q on {dev}")
            qo = ck.indptr("qo_indptr", ck.int_vec("qo_indptr", qo_indptr))
            kvp = ck.indptr("kv_indptr", ck.int_vec("kv_indptr", kv_indptr))
            if len(qo) != len(kvp):
                ck.fail(f"qo_indptr has {len(qo)} entries, kv_indptr {len(kvp)}: both must be B+1")
            if qo[-1] > T:
                ck.fail(f"qo_indptr[-1]={qo[-1]} exceeds Q's {T} rows")
            pages = ck.int_vec("kv_page_indices", kv_page_indices)
            if kvp[-1] > pages.numel():
                ck.fail(f"kv_indptr[-1]={kvp[-1]} exceeds kv_page_indices' {pages.numel()} entries")
            if pages.numel() and (int(pages.min()) < 0 or int(pages.max()) >= K.shape[0]):
                ck.fail(f"kv_page_indices has values outside [0, {K.shape[0]}) (K/V pages)")
            if work_indptr is None:
                ck.fail("work_indptr is None: the grid is work_indptr.size(0)-1 with no null check")
            wi = ck.indptr("work_indptr", ck.int_vec("work_indptr", work_indptr))
            winfo = ck.int_mat("work_info_set", work_info_set, 8)
            if wi[-1] > winfo.shape[0]:
                ck.fail(f"work_indptr reaches work {wi[-1]} but work_info_set has {winfo.shape[0]} rows")
            ck.py_int("max_seqlen_q", max_seqlen_q)
            if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
                ck.fail(f"softmax_scale must be a Python float, got {type(softmax_scale).__name__}")
            if not math.isfinite(softmax_scale) or softmax_scale <= 0:
                ck.fail(f"softmax_scale={softmax_scale} must be finite and > 0")
            causal = ck.py_bool("is_causal", is_causal)
            for name, t in (("splitData", splitData), ("splitLse", splitLse), ("output", output)):
                ck.tensor(name, t)
            ck.dtype("splitData", splitData, torch.float32, why=" (fp32 partials)")
            ck.dtype("splitLse", splitLse, torch.float32, why=" (fp32 partial LSE)")
            ck.dtype("output", output, torch.bfloat16, why=" (the kernel packs bf16 itself)")
            ck.ndim("splitData", splitData, 3, f"[R, {H}, {_V_DIM}]")
            ck.ndim("splitLse", splitLse, 2, f"[R, {H}]")
            ck.ndim("output", output, 3, f"[{T}, {H}, {_V_DIM}]")
            if tuple(splitData.shape[1:]) != (H, _V_DIM) or tuple(splitLse.shape[1:]) != (H,):
                ck.fail(
                    f"splitData {tuple(splitData.shape)} / splitLse {tuple(splitLse.shape)}: "
                    f"must be [R, {H}, {_V_DIM}] / [R, {H}]"
                )
            if splitData.shape[0] != splitLse.shape[0]:
                ck.fail(f"splitData has {splitData.shape[0]} rows but splitLse {splitLse.shape[0]}")
            if tuple(output.shape) != (T, H, _V_DIM):
                ck.fail(f"output has shape {tuple(output.shape)}: must be [{T}, {H}, {_V_DIM}]")
            for name, t in (("splitData", splitData), ("splitLse", splitLse), ("output", output)):
                ck.contiguous(name, t)
            for name, sc in (("q_scale", q_scale), ("k_scale", k_scale), ("v_scale", v_scale)):
                ck.scale(name, sc, dev)
            for name, t in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr), ("kv_page_indices", pages),
                            ("work_indptr", work_indptr), ("work_info_set", winfo), ("splitData", splitData),
                            ("splitLse", splitLse), ("output", output)):  # fmt: skip
                if t.device != dev:
                    ck.fail(f"{name} is on {t.device}: every tensor must be on Q's device {dev}")
            # 32-bit buffer descriptor limits (contract §4)
            for name, n_tok, width in (("Q", T, 192), ("K", int(K.shape[0]), 192), ("output", T, 256)):
                if n_tok * H * width >= 2**32:
                    ck.fail(f"{name} spans {n_tok * H * width} bytes: the kernel's 32-bit buffer range needs < 2**32")
            if splitData.shape[0] * H * 512 >= 2**31:
                ck.fail(f"splitData spans {splitData.shape[0] * H * 512} bytes: must be < 2**31 (32-bit signed range)")
            # the works themselves
            rows = winfo[: wi[-1]].tolist() if wi[-1] else []
            need_rows = 0
            B = len(qo) - 1
            for n, (b, loc, q0, q1, k0, k1, _off, hr) in enumerate(rows):
                if not 0 <= b < B:
                    ck.fail(f"work {n}: batch_idx {b} outside [0, {B})")
                if not (qo[b] <= q0 <= q1 <= qo[b + 1]) or not (kvp[b] <= k0 <= k1 <= kvp[b + 1]):
                    ck.fail(f"work {n}: rows [{q0},{q1}) / kv [{k0},{k1}) outside sequence {b}")
                hr &= 0xFFFFFFFF
                if not 0 <= (hr & 0xFFFF) < (hr >> 16) <= H:
                    ck.fail(f"work {n}: head range [{hr & 0xFFFF}, {hr >> 16}) outside [0, {H})")
                if loc != -1:
                    if loc < 0 or loc % QO_TILE:
                        ck.fail(f"work {n}: partial_o_loc {loc} is not -1 or a multiple of {QO_TILE}")
                    need_rows = max(need_rows, loc + QO_TILE)
            if causal:
                for b in range(B):
                    if qo[b + 1] - qo[b] > kvp[b + 1] - kvp[b]:
                        ck.fail(
                            f"sequence {b}: q_len {qo[b + 1] - qo[b]} > kv_len {kvp[b + 1] - kvp[b]} with "
                            "is_causal (undefined, contract §4)"
                        )
            if splitData.shape[0] < need_rows:
                ck.fail(
                    f"splitData/splitLse have {splitData.shape[0]} rows but the plan's partial slots need "
                    f"{need_rows} (256 per slot; the kernel writes all 256 rows of a slot without bounds checks)"
                )
            emulate_mla_prefill_ps_asm_fwd(
                Q, K, V, qo_indptr, kv_indptr, kv_page_indices, work_indptr, work_info_set, max_seqlen_q,
                float(softmax_scale), causal, splitData, splitLse, output, q_scale, k_scale, v_scale, faults=fs,
            )  # fmt: skip
            return None

        return _record("mla_prefill_ps_asm_fwd", args, body)

    # ---- mla_reduce_v1 -------------------------------------------------------------------------
    def _reduce_body(name_args: dict[str, Any]) -> None:
        ck = _Checker("mla_reduce_v1")
        po = ck.tensor("partial_output", name_args["partial_output"])
        pl = ck.tensor("partial_lse", name_args["partial_lse"])
        ck.dtype("partial_output", po, torch.float32, why=" (fp32 partials)")
        ck.dtype("partial_lse", pl, torch.float32, why=" (fp32 partial LSE)")
        ck.ndim("partial_output", po, 3, "[R, H, dv]")
        ck.ndim("partial_lse", pl, 2, "[R, H]")
        ck.contiguous("partial_output", po, "partials are addressed as raw contiguous rows")
        ck.contiguous("partial_lse", pl, "partials are addressed as raw contiguous rows")
        ri = ck.indptr("reduce_indptr", ck.int_vec("reduce_indptr", name_args["reduce_indptr"]))
        fmap = ck.int_mat("reduce_final_map", name_args["reduce_final_map"], 2)
        pmap = ck.int_vec("reduce_partial_map", name_args["reduce_partial_map"])
        for k in ("max_seqlen_q", "num_kv_splits"):
            if k in name_args:
                v = name_args[k]
                if isinstance(v, torch.Tensor):
                    ck.fail(
                        f"{k} got a Tensor {tuple(v.shape)}: an int is expected there - a call written for "
                        f"the {variant - 1}-argument form puts final_output into the int slot of this "
                        f"{variant}-argument binding (vLLM #46760; contract §3.4)"
                    )
                ck.py_int(k, v)
        fo = ck.tensor("final_output", name_args["final_output"])
        ck.dtype("final_output", fo, torch.bfloat16, torch.float16)
        ck.ndim("final_output", fo, 3, "[total_q, H, dv]")
        if fo.stride(-1) != 1:
            ck.fail(f"final_output's last dim is not contiguous (strides {tuple(fo.stride())})")
        H, dv = int(po.shape[-2]), int(fo.shape[-1])
        if tuple(pl.shape) != (po.shape[0], H):
            ck.fail(f"partial_lse {tuple(pl.shape)} does not match partial_output {tuple(po.shape)}: must be [R, H]")
        if fo.shape[-2] != H or po.shape[-1] != dv:
            ck.fail(f"final_output {tuple(fo.shape)} does not match partial_output {tuple(po.shape)} (H, dv)")
        fl = name_args["final_lse"]
        if fl is not None:
            ck.tensor("final_lse", fl)
            ck.dtype("final_lse", fl, torch.float32)
            if tuple(fl.shape) != (fo.shape[0], H):
                ck.fail(f"final_lse has shape {tuple(fl.shape)}: must be [total_q, H] = [{fo.shape[0]}, {H}]")
            ck.contiguous("final_lse", fl, "addressed as seq*H + head")
        others = [("partial_lse", pl), ("reduce_indptr", name_args["reduce_indptr"]), ("reduce_final_map", fmap),
                  ("reduce_partial_map", pmap), ("final_output", fo)]  # fmt: skip
        if fl is not None:
            others.append(("final_lse", fl))
        for nm, t in others:
            if t.device != po.device:
                ck.fail(f"{nm} is on {t.device}: every tensor must be on partial_output's device {po.device}")
        if len(ri) > 1 and (dv != _V_DIM or H not in heads_ok):
            ck.fail(
                f"doesn't support the specified settings: H={H}, dv={dv} (AITER {mod.__version__} dispatches "
                f"dv=128 with H in {list(heads_ok)}); this fails even when nothing was split, since dispatch "
                "happens whenever reduce_indptr has more than one element (contract §3.4)"
            )
        n_slots = ri[-1]
        if n_slots > pmap.numel():
            ck.fail(f"reduce_indptr[-1]={n_slots} exceeds reduce_partial_map's {pmap.numel()} entries")
        locs = pmap[:n_slots].tolist()
        need = max([0] + [p + QO_TILE for p in locs])
        if any(p < 0 for p in locs):
            ck.fail("reduce_partial_map has negative partial locations")
        if po.shape[0] < need:
            ck.fail(
                f"partial_output/partial_lse have {po.shape[0]} rows but reduce_partial_map needs {need} "
                "(256 rows per partial slot)"
            )
        live = [g for g in range(len(ri) - 1) if ri[g + 1] - ri[g] >= 2]
        if live and max(live) >= fmap.shape[0]:
            ck.fail(f"reduce_final_map has {fmap.shape[0]} rows but group {max(live)} is live")
        if live:
            q1max = max(int(fmap[g, 1]) for g in live)
            if q1max > fo.shape[0]:
                ck.fail(f"final_output has {fo.shape[0]} rows but the reduce writes up to row {q1max}")
        emulate_mla_reduce_v1(po, pl, name_args["reduce_indptr"], fmap, pmap, fo, fl, faults=fs)

    if variant == 7:

        def mla_reduce_v1(
            partial_output, partial_lse, reduce_indptr, reduce_final_map, reduce_partial_map, final_output,
            final_lse=None,
        ):  # fmt: skip
            """Stand-in of the <= v0.1.7 7-argument ``aiter.mla_reduce_v1`` (contract §3.4, §8)."""
            a = dict(partial_output=partial_output, partial_lse=partial_lse, reduce_indptr=reduce_indptr,
                     reduce_final_map=reduce_final_map, reduce_partial_map=reduce_partial_map,
                     final_output=final_output, final_lse=final_lse)  # fmt: skip
            return _record("mla_reduce_v1", a, lambda: _reduce_body(a))

    elif variant == 8:

        def mla_reduce_v1(
            partial_output, partial_lse, reduce_indptr, reduce_final_map, reduce_partial_map, max_seqlen_q,
            final_output, final_lse=None,
        ):  # fmt: skip
            """Stand-in of the v0.1.8 .. v0.1.15.x 8-argument ``aiter.mla_reduce_v1`` (contract §3.4, §8)."""
            a = dict(partial_output=partial_output, partial_lse=partial_lse, reduce_indptr=reduce_indptr,
                     reduce_final_map=reduce_final_map, reduce_partial_map=reduce_partial_map,
                     max_seqlen_q=max_seqlen_q, final_output=final_output, final_lse=final_lse)  # fmt: skip
            return _record("mla_reduce_v1", a, lambda: _reduce_body(a))

    else:

        def mla_reduce_v1(
            partial_output, partial_lse, reduce_indptr, reduce_final_map, reduce_partial_map, max_seqlen_q,
            num_kv_splits, final_output, final_lse=None,
        ):  # fmt: skip
            """Stand-in of the >= v0.1.16 9-argument ``aiter.mla_reduce_v1`` (ROCm/aiter#3391;
            contract §3.4, §8). Prefill call: ``(..., 256, 0, output, final_lse)``."""
            a = dict(partial_output=partial_output, partial_lse=partial_lse, reduce_indptr=reduce_indptr,
                     reduce_final_map=reduce_final_map, reduce_partial_map=reduce_partial_map,
                     max_seqlen_q=max_seqlen_q, num_kv_splits=num_kv_splits, final_output=final_output,
                     final_lse=final_lse)  # fmt: skip
            return _record("mla_reduce_v1", a, lambda: _reduce_body(a))

    mod.mla_reduce_v1 = mla_reduce_v1
    if has_ps:
        mod.get_ps_metadata_info_v1 = get_ps_metadata_info_v1
        mod.get_ps_metadata_v1 = get_ps_metadata_v1
        mod.mla_prefill_ps_asm_fwd = mla_prefill_ps_asm_fwd
    for fn in (get_ps_metadata_info_v1, get_ps_metadata_v1, mla_prefill_ps_asm_fwd, mla_reduce_v1):
        fn.__module__ = "aiter"
    return mod

