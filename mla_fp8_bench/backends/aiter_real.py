"""The AITER persistent-scheduled FP8 MLA prefill, called through its three primitives.

``get_ps_metadata_v1`` (host planner) -> ``mla_prefill_ps_asm_fwd`` (ASM kernel) -> ``mla_reduce_v1``
(merge of split tiles), exactly as docs/aiter-ps-prefill-contract.md §3 specifies:

* every planner keyword passed explicitly (the stub's defaults ``kvlen_granularity=16, block_size=16``
  are wrong; the binding's are 1, 1): ``qhead_granularity=1, qlen_granularity=256,
  kvlen_granularity=128, block_size=1, is_causal=True``;
* q/k/v contiguous ``float8_e4m3fn``, v its own contiguous tensor; identity ``kv_page_indices``;
* scales always one-element fp32 *device* tensors (``None`` is a null dereference in the kernel);
* partial buffers sized from the live partial count ``reduce_indptr[-1]`` (one sync, outside the
  timed region), not from the loose ``get_ps_metadata_info_v1`` bound;
* ``mla_reduce_v1``'s form is feature-detected with :func:`inspect.signature`: ``num_kv_splits``
  present -> 9 arguments (>= v0.1.16), ``max_seqlen_q`` only -> 8 (v0.1.8 ... v0.1.15), neither -> 7
  (<= v0.1.7, too old for the PS prefill: reported unavailable);
* head counts outside the reduce's dispatch set for the installed version are reported unsupported
  instead of crashing (§3.4).

The same driver (:class:`AiterPsDriver`) runs over the real ``aiter`` module on gfx950 and over the
emulator-backed stand-in (:mod:`mla_fp8_bench.aiter_ps.standin`) everywhere else (backend
``aiter-emulated``), so the code that will meet a gfx950 runner is the code tested in CI.
"""

from __future__ import annotations

import inspect
import time
import types
from typing import Any

import torch

from mla_fp8_bench.backends.base import Backend, BackendUnavailable, CaseUnsupported, Prepared, Verdict
from mla_fp8_bench.measure.devices import PlatformInfo
from mla_fp8_bench.problem.cases import Case
from mla_fp8_bench.problem.inputs import CaseInputs

TILE_Q = 256  # qlen_granularity: rows of one q-tile (AITER kernel m32x8 -> 256 rows)
KVLEN_GRANULARITY = 128  # max(128, block_size), power of two (checked by the planner)
PRIMITIVES = ("get_ps_metadata_info_v1", "get_ps_metadata_v1", "mla_prefill_ps_asm_fwd", "mla_reduce_v1")

#: Head counts ``mla_reduce_v1`` dispatches for dv=128, by the AITER version that added them (§3.4).
_REDUCE_HEADS_BY_VERSION = (
    ((0, 1, 10), (1, 2, 4, 8, 10, 16, 128)),
    ((0, 1, 11), (32, 64)),
    ((0, 1, 12), (40,)),
    ((0, 1, 20), (48, 96)),
)


def reduce_heads_for(version: tuple[int, int, int] | None) -> frozenset[int]:
    """Head counts ``mla_reduce_v1`` accepts at dv=128 for an AITER version (None: newest known)."""
    heads: set[int] = set()
    for v, hs in _REDUCE_HEADS_BY_VERSION:
        if version is None or version >= v:
            heads.update(hs)
    return frozenset(heads)


def parse_aiter_version(text: str | None) -> tuple[int, int, int] | None:
    """``"0.1.20.post1"`` -> ``(0, 1, 20)``; None when unparsable."""
    if not text:
        return None
    import re

    m = re.match(r"(\d+)\.(\d+)\.(\d+)", text)
    return tuple(int(x) for x in m.groups()) if m else None  # type: ignore[return-value]


def detect_reduce_arity(fn: Any) -> int:
    """7, 8 or 9: the ``mla_reduce_v1`` form, from its signature (contract §2 markers)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return 9  # opaque builtin: assume the current form
    if "num_kv_splits" in params:
        return 9
    if "max_seqlen_q" in params:
        return 8
    return 7


def planner_markers(module: Any) -> dict[str, bool]:
    """Newer planner keywords present in this AITER (``need_lse``: #3606-style LSE for every row)."""
    out = {}
    for fn_name, key in (("get_ps_metadata_v1", "need_lse"), ("get_ps_metadata_info_v1", "max_kvlen"),
                         ("get_ps_metadata_info_v1", "total_qlen")):
        try:
            out[key] = key in inspect.signature(getattr(module, fn_name)).parameters
        except (TypeError, ValueError, AttributeError):
            out[key] = False
    return out


def _as_dtype(d: Any) -> torch.dtype:
    if isinstance(d, torch.dtype):
        return d
    name = str(d).replace("torch.", "")
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"get_ps_metadata_info_v1 returned unknown dtype {d!r}")
    return dt


class AiterPsDriver:
    """Drive the AITER PS FP8 prefill primitives of ``module`` (real ``aiter`` or the stand-in).

    Args:
        module: an object exposing :data:`PRIMITIVES`.
        version: the AITER version (for the reduce's head-count dispatch), None if unknown.

    Raises:
        BackendUnavailable: a primitive is missing or ``mla_reduce_v1`` has the 7-argument form.
    """

    def __init__(self, module: Any, version: tuple[int, int, int] | None = None):
        missing = [p for p in PRIMITIVES if not hasattr(module, p)]
        if missing:
            raise BackendUnavailable(f"aiter lacks {', '.join(missing)} (the PS prefill needs >= v0.1.10.post1)")
        self.m = module
        self.version = version
        self.reduce_arity = detect_reduce_arity(module.mla_reduce_v1)
        if self.reduce_arity == 7:
            raise BackendUnavailable("aiter's mla_reduce_v1 has the 7-argument (<= v0.1.7) form: too old for the PS prefill")
        self.markers = planner_markers(module)

    # ------------------------------------------------------------------ support
    def supports_heads(self, num_heads: int) -> Verdict:
        allowed = reduce_heads_for(self.version)
        if num_heads not in allowed:
            v = ".".join(map(str, self.version)) if self.version else "the newest known version"
            return Verdict.no(f"mla_reduce_v1 of aiter {v} dispatches num_heads in {sorted(allowed)} "
                              f"for v_head_dim 128; got {num_heads}")
        return Verdict.yes()

    # ------------------------------------------------------------------ planning
    def plan(self, cu_seqlens_cpu: torch.Tensor, num_heads: int, device: torch.device) -> dict[str, Any]:
        """Allocate the six planner buffers on ``device`` and run the host planner (timed).

        Returns:
            dict with the buffers, ``planner_s`` (seconds), ``num_partials`` (``reduce_indptr[-1]``).
        """
        cu = cu_seqlens_cpu.to(torch.int32).contiguous()
        seq_lens = (cu[1:] - cu[:-1]).contiguous()
        batch = int(seq_lens.numel())
        max_qlen = int(seq_lens.max().item())
        info = self.m.get_ps_metadata_info_v1(batch_size=batch, num_head_k=num_heads, max_qlen=max_qlen,
                                              qlen_granularity=TILE_Q)
        names = ("work_metadata_ptrs", "work_indptr", "work_info", "reduce_indptr", "reduce_final_map",
                 "reduce_partial_map")
        # real AITER gives 1-D sizes as bare ints and 2-D shapes as tuples
        bufs = {n: torch.zeros((int(shape),) if isinstance(shape, int) else tuple(shape), dtype=_as_dtype(dt),
                               device=device) for n, (shape, dt) in zip(names, info)}
        kw: dict[str, Any] = dict(qhead_granularity=1, qlen_granularity=TILE_Q, kvlen_granularity=KVLEN_GRANULARITY,
                                  block_size=1, is_causal=True)
        t0 = time.perf_counter()
        self.m.get_ps_metadata_v1(cu, cu.clone(), seq_lens, 1, num_heads, bufs["work_metadata_ptrs"],
                                  bufs["work_indptr"], bufs["work_info"], bufs["reduce_indptr"],
                                  bufs["reduce_final_map"], bufs["reduce_partial_map"], **kw)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        planner_s = time.perf_counter() - t0
        num_partials = int(bufs["reduce_indptr"][-1].item())
        return {**bufs, "planner_s": planner_s, "num_partials": num_partials}

    # ------------------------------------------------------------------ the call
    def prepare(self, inputs: CaseInputs) -> Prepared:
        """Plan, allocate and return the kernel + reduce call (both graph-capturable)."""
        h = inputs.case.num_heads
        if inputs.fp8_dtype != torch.float8_e4m3fn:
            raise CaseUnsupported(f"the PS prefill kernel takes float8_e4m3fn only, not {inputs.fp8_dtype}")
        dev = inputs.device
        q8, k8, v8 = (x.data.contiguous() for x in (inputs.q8, inputs.k8, inputs.v8))
        scales = [x.descale.reshape(1).to(device=dev, dtype=torch.float32).contiguous()
                  for x in (inputs.q8, inputs.k8, inputs.v8)]
        t = q8.shape[0]
        dv = v8.shape[-1]
        cu_dev = inputs.cu_seqlens.to(device=dev, dtype=torch.int32).contiguous()
        kv_page_indices = torch.arange(t, dtype=torch.int32, device=dev)
        plan = self.plan(inputs.cu_seqlens_cpu, h, dev)
        rows = max(1, plan["num_partials"]) * TILE_Q
        split_data = torch.empty(rows, h, dv, dtype=torch.float32, device=dev)
        split_lse = torch.empty(rows, h, dtype=torch.float32, device=dev)
        output = torch.full((t, h, dv), float("nan"), dtype=torch.bfloat16, device=dev)
        final_lse = torch.full((t, h), float("nan"), dtype=torch.float32, device=dev)
        m = self.m

        def run() -> torch.Tensor:
            m.mla_prefill_ps_asm_fwd(q8, k8, v8, cu_dev, cu_dev, kv_page_indices, plan["work_indptr"],
                                     plan["work_info"], inputs.max_seqlen, inputs.softmax_scale, True,
                                     split_data, split_lse, output, scales[0], scales[1], scales[2])
            if self.reduce_arity == 9:
                m.mla_reduce_v1(split_data, split_lse, plan["reduce_indptr"], plan["reduce_final_map"],
                                plan["reduce_partial_map"], TILE_Q, 0, output, final_lse)
            else:
                m.mla_reduce_v1(split_data, split_lse, plan["reduce_indptr"], plan["reduce_final_map"],
                                plan["reduce_partial_map"], TILE_Q, output, final_lse)
            return output

        groups = plan["reduce_indptr"].cpu()
        final_map = plan["reduce_final_map"].cpu()

        def lse() -> tuple[torch.Tensor, torch.Tensor]:
            valid = torch.zeros(t, dtype=torch.bool)
            if self.markers.get("need_lse"):
                valid[:] = True
            else:  # pre-#3606: final_lse is written only for rows of split tiles
                for g in range(final_map.shape[0]):
                    if int(groups[g + 1]) - int(groups[g]) >= 2:
                        valid[int(final_map[g, 0]):int(final_map[g, 1])] = True
            return final_lse, valid

        ws = (split_data.numel() + split_lse.numel() + final_lse.numel()) * 4
        return Prepared(run=run, graph_capturable=dev.type == "cuda", timing_scope="kernel", lse=lse,
                        extras={"planner_s": plan["planner_s"], "num_partials": plan["num_partials"],
                                "workspace_bytes": ws, "reduce_arity": self.reduce_arity})


def workspace_bytes(num_partials: int, total_tokens: int, num_heads: int, v_head_dim: int = 128) -> int:
    """Scratch bytes of one call: fp32 partial output ``[P*256, H, dv]`` + partial LSE ``[P*256, H]``
    + final LSE ``[T, H]`` (P = live partial slots, at least 1)."""
    rows = max(1, num_partials) * TILE_Q
    return 4 * (rows * num_heads * v_head_dim + rows * num_heads + total_tokens * num_heads)


def plan_stats_with(driver_plan, case: Case, device: torch.device, repeats: int = 7) -> dict[str, Any]:
    """Planner time samples (seconds), live partials and workspace bytes for ``case``."""
    cu = torch.tensor(case.cu_seqlens(), dtype=torch.int32)
    samples, last = [], None
    for _ in range(repeats):
        last = driver_plan(cu, case.num_heads, device)
        samples.append(last["planner_s"])
    return {"planner_samples_s": samples, "num_partials": last["num_partials"],
            "workspace_bytes": workspace_bytes(last["num_partials"], case.total_tokens, case.num_heads)}


#: Opt-in (``=1``) to drive whatever ``aiter`` is installed on a non-gfx950 machine (a CPU, a test
#: library): every record is then labelled ``timing_scope="emulation"`` and ``aiter_off_device=True``.
ANY_DEVICE_ENV = "MLA_FP8_BENCH_AITER_ANY_DEVICE"


def aiter_any_device() -> bool:
    """True when :data:`ANY_DEVICE_ENV` is ``1`` (any other value but empty/``0`` raises ValueError)."""
    import os

    raw = os.environ.get(ANY_DEVICE_ENV, "")
    if raw not in ("", "0", "1"):
        raise ValueError(f"{ANY_DEVICE_ENV}={raw!r} is invalid: 1 (drive a non-gfx950 aiter) or 0/unset")
    return raw == "1"


def _aiter_gate(platform: PlatformInfo) -> Verdict:
    if platform.vendor != "rocm":
        found = platform.arch if platform.vendor == "cuda" else "a CPU-only torch"
        return Verdict.no(f"needs an AMD gfx950 GPU with a ROCm build of torch; found {found}")
    if platform.arch != "gfx950":
        return Verdict.no(f"needs gfx950 (MI350/MI355); found {platform.arch}"
                          + (": fp8 mla persistent prefill is not supported on gfx942" if platform.arch == "gfx942" else ""))
    return Verdict.yes()


def import_real_aiter() -> types.ModuleType:
    """Import the real ``aiter`` (only on ROCm: its import runs rocminfo)."""
    import aiter  # noqa: PLC0415

    return aiter


class AiterReal(Backend):
    name = "aiter"
    description = "AITER mla_prefill_ps_asm_fwd + mla_reduce_v1 (gfx950), planner outside the timed region"
    fp8 = True

    def __init__(self) -> None:
        self._driver: AiterPsDriver | None = None
        self._why = ""

    def _get_driver(self) -> AiterPsDriver:
        if self._driver is None:
            from importlib.metadata import PackageNotFoundError, version

            try:
                module = import_real_aiter()
            except Exception as exc:  # noqa: BLE001
                raise BackendUnavailable(f"cannot import aiter: {type(exc).__name__}: {exc}") from None
            try:
                ver = parse_aiter_version(version("amd-aiter"))
            except PackageNotFoundError:
                ver = parse_aiter_version(getattr(module, "__version__", None))
            self._driver = AiterPsDriver(module, ver)
        return self._driver

    def availability(self, platform: PlatformInfo) -> Verdict:
        gate = _aiter_gate(platform)
        self.emulation = bool(not gate and aiter_any_device())  # off gfx950: labelled, never a kernel's time
        if not gate and not self.emulation:
            return gate
        try:
            self._get_driver()
        except BackendUnavailable as exc:
            return Verdict.no(str(exc))
        return Verdict.yes()

    def supports(self, case: Case, platform: PlatformInfo) -> Verdict:
        return self._get_driver().supports_heads(case.num_heads)

    def prepare(self, inputs: CaseInputs) -> Prepared:
        p = self._get_driver().prepare(inputs)
        if self.emulation:
            p.graph_capturable = False
            p.timing_scope = "emulation"
            p.extras["aiter_off_device"] = True
        return p

    def plan_stats(self, case: Case, platform: PlatformInfo) -> dict[str, Any]:
        return plan_stats_with(self._get_driver().plan, case, platform.device)
