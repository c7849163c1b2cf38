"""``vllm-aiter``: the real ``AiterMLAImpl._mla_fp8_prefill_attn`` set up as vLLM's seed test (PR #51457)
does (docs/aiter-contract.md#vllm-entry, docs/cpu-tiers.md). Timing scope ``"call"``: the fp8 casts and head
padding are timed; planning and the workspace reservation are not. Only ``quant="cast"`` prefill cases run."""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import re
import sys
import time
import types
from collections import namedtuple
from dataclasses import asdict, dataclass, replace
from types import SimpleNamespace
from typing import Any

import torch

from mla_fp8_bench.aiter_ps import facts
from mla_fp8_bench.backends.aiter_real import AiterPsDriver, aiter_gate, load_aiter
from mla_fp8_bench.backends.base import Backend, BackendUnavailable, CaseUnsupported, Prepared, Verdict
from mla_fp8_bench.measure.devices import PlatformInfo, synchronize
from mla_fp8_bench.problem.cases import Case
from mla_fp8_bench.problem.inputs import CaseInputs
from mla_fp8_bench.problem.shapes import V_HEAD_DIM

DEFAULT_VLLM_MODULE = "vllm.v1.attention.backends.mla.rocm_aiter_mla"
DEFAULT_WORKSPACE_MODULE = "vllm.v1.worker.workspace"
#: Why ``ctx``/``prefix`` cases are skipped (vLLM 0.28 ... 0.33.0).
CHUNKED_CONTEXT_SKIP = (
    "vLLM skips the FP8 PS prefill for batches with cached context (vLLM #52356; up to 0.33.0 "
    "_build_fp8_prefill_ps_metadata plans only when prefill.chunked_context is None and forward_mha falls "
    "back to the bf16 path); its AITER_ASM prefill backend for context chunks (vLLM #44544) is in no release"
)


class VllmAdapterError(RuntimeError):
    """vLLM's entry does not match what the adapter calls (a signature or attribute changed)."""


class WorkspaceGrewAfterLock(RuntimeError):
    """vLLM's forward asked its locked workspace for more than the builder reserved (vLLM #42978)."""


@dataclass(frozen=True)
class VllmFeatures:
    """What this vLLM's FP8 prefill path does, detected from its code (:func:`detect_features`)."""

    attn_out_dtype: bool  # a parameter of _init_fp8_prefill_ps_buffers (0.29)
    pads_heads: bool  # AiterMLAHelper.get_fp8_prefill_num_heads (0.29)
    budget_sizing: bool  # the buffers read num_compute_units (0.31)
    staging: bool  # pinned plan staging _fp8_ps_staging (0.32)
    one_scale_cache: bool  # _mla_fp8_prefill_attn reads _fp8_prefill_one_scale (0.33)
    version: str | None = None


@dataclass
class VllmEntry:
    module: types.ModuleType  # vLLM's rocm_aiter_mla
    workspace: types.ModuleType
    features: VllmFeatures

    def fp8_heads(self, num_heads: int) -> tuple[Verdict, int]:
        """(does vLLM run the FP8 prefill at ``num_heads``, the head count the kernel is handed)."""
        f, helper = self.features, getattr(self.module, "AiterMLAHelper", None)
        ver = f.version or "(version unknown)"
        if not f.pads_heads:
            if num_heads % 16:
                return Verdict.no(f"vLLM {ver} (no head padding; padding arrived in 0.29, #51040) enables the "
                                  f"FP8 prefill only for num_heads % 16 == 0; {num_heads} heads fall back to the bf16 "
                                  "flash_attn path"), num_heads
            return Verdict.yes(), num_heads
        if not helper.is_valid_num_heads(num_heads):
            return Verdict.no(f"vLLM {ver} gates the FP8 prefill on AiterMLAHelper.is_valid_num_heads "
                              f"(0 < n <= 128 or a multiple of 16): {num_heads} heads take the bf16 path"), num_heads
        return Verdict.yes(), int(helper.get_fp8_prefill_num_heads(num_heads))


def _code_names(fn: Any) -> frozenset[str]:
    return frozenset(getattr(getattr(inspect.unwrap(fn), "__code__", None), "co_names", ()))


def detect_features(module: types.ModuleType) -> VllmFeatures:
    """Feature-detect a ``rocm_aiter_mla`` module (signatures and the names its methods touch);
    :class:`VllmAdapterError` when it lacks the FP8 prefill entry (vLLM < 0.28 or a refactor)."""
    impl = getattr(module, "AiterMLAImpl", None)
    builder = getattr(module, "AiterMLAMetadataBuilder", None)
    need = [("AiterMLAImpl", impl, "_mla_fp8_prefill_attn"),
            ("AiterMLAMetadataBuilder", builder, "_init_fp8_prefill_ps_buffers"),
            ("AiterMLAMetadataBuilder", builder, "_build_fp8_prefill_ps_metadata")]
    missing = [f"{c}.{m}" for c, cls, m in need if cls is None or not hasattr(cls, m)]
    if missing:
        raise VllmAdapterError(f"{module.__name__} lacks {', '.join(missing)}: the FP8 MLA prefill entry needs "
                               "vllm >= 0.28")
    init, names = builder._init_fp8_prefill_ps_buffers, _code_names(builder._init_fp8_prefill_ps_buffers)
    version = getattr(sys.modules.get(module.__name__.split(".")[0]), "__version__", None)
    return VllmFeatures("attn_out_dtype" in inspect.signature(init).parameters,
                        hasattr(getattr(module, "AiterMLAHelper", None), "get_fp8_prefill_num_heads"),
                        "num_compute_units" in names, "_fp8_ps_staging" in names,
                        "_fp8_prefill_one_scale" in _code_names(impl._mla_fp8_prefill_attn),
                        str(version) if version is not None else None)


def fp8_path_condition(builder_cls: type) -> dict[str, Any]:
    """Whether vLLM takes the FP8 PS prefill for the imitated pair (fp8 KV cache, bf16 model): ``taken``,
    and ``gates_on_dtypes`` when the builder's ``_fp8_prefill_enabled`` assignment tests both dtypes (0.33),
    else every pair takes it (vLLM #52312). Platform and head count: ``availability`` / ``supports``."""
    pair = {"kv_cache_dtype": "fp8", "model_dtype": "bfloat16"}  # vLLM serving a bf16 model, fp8 KV cache
    try:
        src = inspect.getsource(builder_cls.__init__)
    except (OSError, TypeError):
        return {"taken": None, "why": "the builder's source cannot be read", **pair}
    m = re.search(r"self\._fp8_prefill_enabled\s*=\s*(.*?)\n\s*if self\._fp8_prefill_enabled", src, re.S)
    gated = bool(m) and "kv_cache_dtype" in m.group(1) and "bfloat16" in m.group(1)
    why = ("vLLM enables it only with an fp8 KV cache and a bf16 model" if gated else
           "vLLM enables it whatever the KV cache and model dtypes (no dtype gate, vLLM #52312)")
    return {"taken": bool(m), "gates_on_dtypes": gated, "why": why, **pair}


def load_vllm_entry(vllm_module: str = DEFAULT_VLLM_MODULE,
                    workspace_module: str = DEFAULT_WORKSPACE_MODULE) -> VllmEntry:
    """Import vLLM's ``rocm_aiter_mla`` and workspace modules (or stand-ins at other paths); ImportError
    or :class:`VllmAdapterError` (the entry or a workspace function is missing)."""
    mod = importlib.import_module(vllm_module)
    ws = importlib.import_module(workspace_module)
    missing = [n for n in ("init_workspace_manager", "lock_workspace", "reset_workspace_manager",
                           "current_workspace_manager") if not hasattr(ws, n)]
    if missing:
        raise VllmAdapterError(f"{workspace_module} lacks {', '.join(missing)} (vLLM's workspace manager, #42978)")
    return VllmEntry(mod, ws, detect_features(mod))


def _ws_fact(ws: types.ModuleType, fact: Any) -> Any:
    """``fact(manager)`` of vLLM's workspace manager, None when it fails (informational only)."""
    try:
        return fact(ws.current_workspace_manager())
    except Exception:  # noqa: BLE001
        return None


def _held_bytes(manager: Any) -> int:  # reads a private list
    return int(sum(b.numel() * b.element_size() for b in manager._current_workspaces if b is not None))


def _bind_or_explain(fn: Any, kwargs: dict[str, Any]) -> None:
    """Fail with a clear message when vLLM's signature does not take the adapter's arguments."""
    try:
        inspect.signature(fn).bind(None, **kwargs)
    except TypeError as exc:
        raise VllmAdapterError(
            f"vLLM's AiterMLAMetadataBuilder.{fn.__name__}{inspect.signature(fn)} does not accept the adapter's "
            f"arguments ({', '.join(kwargs)}): {exc}. The signature changed across releases (attn_out_dtype added in "
            "0.29, #51040); the adapter must follow it."
        ) from None


def _timed_build(builder: Any, cu_cpu: torch.Tensor, device: torch.device) -> tuple[Any, float]:
    """``(metadata, seconds)`` of one ``_build_fp8_prefill_ps_metadata`` of a prefill-only step (stand-ins for
    vLLM's ``attn_metadata`` and ``common_attn_metadata``; device-synchronised on CUDA/HIP)."""
    prefill = SimpleNamespace(query_start_loc=cu_cpu.to(device), max_query_len=int((cu_cpu[1:] - cu_cpu[:-1]).max()))
    metadata = SimpleNamespace(prefill=prefill, num_decodes=0)
    t0 = time.perf_counter()
    builder._build_fp8_prefill_ps_metadata(metadata, SimpleNamespace(query_start_loc_cpu=cu_cpu))
    synchronize(device)
    return metadata, time.perf_counter() - t0


def plan_width(metadata: Any) -> int:
    """Heads the builder's plan covers: the largest end head of its works' ``q_head_range``."""
    works = int(metadata.fp8_prefill_work_indptr[-1])
    ranges = metadata.fp8_prefill_work_info_set[:works, facts.WORK_INFO_FIELDS.index("q_head_range")].cpu().long()
    return int(facts.unpack_q_head_range(ranges)[1].max()) if works else 0


_Setup = namedtuple("_Setup", "impl builder metadata build_s num_partials num_head_k reserved_bytes")


class VllmAiter(Backend):
    """vLLM's FP8 prefill on AITER (gfx950). The CPU tests drive it over stand-in modules (``tests/support``)
    through :attr:`vllm_module`, :attr:`workspace_module`, :attr:`bypass_gate` and :meth:`_aiter_for_vllm`."""

    name = "vllm-aiter"
    description = "vLLM AiterMLAImpl._mla_fp8_prefill_attn (real vLLM code; bf16 in, casts/padding timed)"
    fp8 = True
    context_chunks = Verdict.no(CHUNKED_CONTEXT_SKIP)
    #: Import paths of vLLM's ``rocm_aiter_mla`` and workspace modules.
    vllm_module: str = DEFAULT_VLLM_MODULE
    workspace_module: str = DEFAULT_WORKSPACE_MODULE
    #: Skip the ROCm/gfx950 and ``_fp8_mla_prefill_supported()`` checks (an adapter over a given ``aiter``).
    bypass_gate: bool = False
    _entry: VllmEntry | None = None
    _aiter: types.ModuleType | None = None  # the ``aiter`` vLLM is handed (None: the installed one)
    _driver: AiterPsDriver | None = None

    def _aiter_for_vllm(self) -> contextlib.AbstractContextManager:
        """Held while vLLM's builder imports ``from aiter``: the installed ``aiter`` needs nothing."""
        return contextlib.nullcontext()

    def entry(self) -> VllmEntry:
        if self._entry is None:
            try:
                self._entry = load_vllm_entry(self.vllm_module, self.workspace_module)
            except VllmAdapterError as exc:
                raise BackendUnavailable(str(exc)) from None
            except Exception as exc:  # noqa: BLE001 - any import failure is "unavailable"
                raise BackendUnavailable(f"cannot import {self.vllm_module}: {type(exc).__name__}: {exc}") from None
        return self._entry

    def driver(self) -> AiterPsDriver:
        """A driver over the ``aiter`` vLLM is handed: its detected reduce form and probed head support;
        BackendUnavailable: no import, a missing primitive, not the 9-argument reduce vLLM calls."""
        if self._driver is None:
            module = self._aiter if self._aiter is not None else load_aiter()  # only on ROCm (availability)
            drv = AiterPsDriver(module, facts.aiter_version_of(module))
            if drv.reduce_arity != 9:
                raise BackendUnavailable(
                    "vLLM calls mla_reduce_v1 with 9 arguments (num_kv_splits, #46760) but this aiter has the "
                    f"{drv.reduce_arity}-argument form ({drv.reduce_source}): vLLM needs aiter >= v0.1.16")
            self._driver = drv
        return self._driver

    def availability(self, platform: PlatformInfo) -> Verdict:
        if not self.bypass_gate:
            gate = aiter_gate(platform)
            if not gate:
                return gate
            missing = [p for p in ("vllm", "aiter") if importlib.util.find_spec(p) is None]
            if missing:
                return Verdict.no(f"{missing[0]} is not importable: install a ROCm build of vllm >= 0.28 and "
                                  "amd-aiter >= v0.1.16 built for gfx950")
        try:
            drv, entry = self.driver(), self.entry()
        except BackendUnavailable as exc:
            return Verdict.no(str(exc))
        if platform is not None:
            drv.device = platform.device
        gate_fn = getattr(entry.module, "_fp8_mla_prefill_supported", None)
        if not self.bypass_gate and gate_fn is not None and not gate_fn():
            return Verdict.no("vLLM's own gate _fp8_mla_prefill_supported() is False (vllm.platforms.rocm.on_gfx950() "
                              "or `from aiter import mla_prefill_ps_asm_fwd, mla_reduce_v1` failed): vLLM would not "
                              "take the FP8 prefill here")
        return Verdict.yes()

    def supports(self, case: Case, platform: PlatformInfo) -> Verdict:
        if not self.supports_kind(case.kind):  # context chunks (CHUNKED_CONTEXT_SKIP) and b2b batches
            return Verdict.no(f"{case.family} case: {self.supports_kind(case.kind).reason}")
        if case.quant != "cast":
            return Verdict.no(f"vLLM's _mla_fp8_prefill_attn always casts bf16 to fp8 at unit scale (quant 'cast'); "
                              f"this case quantises {case.quant} (amax/448), which vLLM cannot run: use "
                              f"{replace(case, quant='cast').id!r}")
        try:
            verdict, padded = self.entry().fp8_heads(case.num_heads)
            heads = self.driver().supports_heads(padded) if verdict else verdict
        except BackendUnavailable as exc:
            return Verdict.no(str(exc))
        if verdict and not heads:
            return Verdict.no(f"vLLM runs {case.num_heads} heads at {padded}, which aiter refuses: {heads.reason}")
        return verdict

    def prepare(self, inputs: CaseInputs) -> Prepared:
        case = inputs.case
        sup = self.supports(case, None)  # type: ignore[arg-type] - platform unused
        if not sup:
            raise CaseUnsupported(sup.reason)
        if inputs.fp8_dtype != torch.float8_e4m3fn:
            raise CaseUnsupported(f"vLLM casts to current_platform.fp8_dtype() (float8_e4m3fn on gfx950); inputs use "
                                  f"{inputs.fp8_dtype}")
        entry, ws, dev, t, h = self.entry(), self.entry().workspace, inputs.device, case.total_tokens, case.num_heads
        ws.init_workspace_manager(dev)
        try:
            st = self._setup(entry, case.num_heads, inputs.softmax_scale, inputs.cu_seqlens_q_cpu, dev)
            widths = (plan_width(st.metadata), st.num_head_k)
            out = torch.empty(t, h * V_HEAD_DIM, dtype=torch.bfloat16, device=dev)
        except BaseException:
            ws.reset_workspace_manager()
            raise

        def run() -> torch.Tensor:
            try:
                st.impl._mla_fp8_prefill_attn(inputs.q, inputs.k, inputs.v, st.metadata, out)
            except AssertionError as exc:
                if "Workspace is locked" not in str(exc):
                    raise
                raise WorkspaceGrewAfterLock(
                    f"the workspace grew after lock_workspace(): the builder planned and reserved {widths[0]} heads, "
                    f"the forward runs {widths[1]} (vLLM: {str(exc).strip()})") from None
            return out.view(t, h, V_HEAD_DIM)

        feats, locked = entry.features, _ws_fact(ws, lambda m: bool(m.is_locked()))
        return Prepared(run=run, graph_capturable=dev.type == "cuda", timing_scope="call",
                        cleanup=ws.reset_workspace_manager,
                        extras={"planner_s": st.build_s, "num_partials": st.num_partials,
                                "workspace_bytes": st.reserved_bytes, "reserved_workspace_bytes": st.reserved_bytes,
                                "num_head_k": st.num_head_k, "plan_num_heads": widths[0], "workspace_locked": locked,
                                "vllm_version": feats.version,
                                "vllm_fp8_path": fp8_path_condition(entry.module.AiterMLAMetadataBuilder),
                                "vllm_features": {k: v for k, v in asdict(feats).items() if k != "version"}})

    def _setup(self, entry: VllmEntry, num_heads: int, scale: float, cu_seqlens_cpu: torch.Tensor,
               device: torch.device, *, lock: bool = True) -> _Setup:
        """Builder buffers + reservation, one metadata build, lock, and the bare impl. The workspace
        manager must be initialised; the caller resets it."""
        cu_cpu = cu_seqlens_cpu.to(torch.int32).contiguous()
        lens = cu_cpu[1:] - cu_cpu[:-1]
        b, t, max_q = int(lens.numel()), int(cu_cpu[-1]), int(lens.max())
        builder_cls = entry.module.AiterMLAMetadataBuilder
        builder = object.__new__(builder_cls)
        builder.num_heads = num_heads
        builder.mla_dims = SimpleNamespace(v_head_dim=V_HEAD_DIM)
        kw = self._buffer_kwargs(entry.features, dict(max_num_reqs=b, max_prefill_qlen=max_q, max_num_batched_tokens=t))
        kw["device"] = device
        _bind_or_explain(builder_cls._init_fp8_prefill_ps_buffers, kw)
        with self._aiter_for_vllm():
            builder._init_fp8_prefill_ps_buffers(**kw)
            reserved = _ws_fact(entry.workspace, _held_bytes)
            metadata, build_s = _timed_build(builder, cu_cpu, device)
        if lock:
            self._lock(entry.workspace)
        impl = object.__new__(entry.module.AiterMLAImpl)
        impl.num_heads, impl.v_head_dim, impl.scale = num_heads, V_HEAD_DIM, float(scale)
        self._bind_ops(impl, self.driver().m, entry.features)
        n_part = metadata.fp8_prefill_num_partial_tiles
        return _Setup(impl, builder, metadata, build_s, int(n_part or 0), entry.fp8_heads(num_heads)[1], reserved)

    @staticmethod
    def _buffer_kwargs(feats: VllmFeatures, kw: dict[str, Any]) -> dict[str, Any]:
        """``_init_fp8_prefill_ps_buffers``'s keyword arguments for this release (``device`` aside)."""
        if feats.attn_out_dtype:
            kw["attn_out_dtype"] = torch.bfloat16  # model_config.dtype: the path requires a bf16 model
        return kw

    @staticmethod
    def _lock(workspace: Any) -> None:
        """Lock vLLM's workspace after the reservation, as vLLM does after its warm-up."""
        workspace.lock_workspace()

    @staticmethod
    def _bind_ops(impl: Any, aiter: types.ModuleType, feats: VllmFeatures) -> None:
        """The AITER ops and per-release attributes vLLM's ``__init__`` sets on the impl."""
        impl._mla_prefill_ps_asm_fwd = aiter.mla_prefill_ps_asm_fwd
        impl._mla_reduce_v1 = aiter.mla_reduce_v1
        if feats.one_scale_cache:
            impl._fp8_prefill_one_scale = None

    def plan_stats(self, case: Case, platform: PlatformInfo, repeats: int = 7) -> dict[str, Any]:
        """Seconds of the real ``_build_fp8_prefill_ps_metadata`` (``planner_samples_s``), live partial tiles and
        the workspace vLLM's builder reserves (``workspace_bytes``: what its manager holds; max_num_reqs =
        batch, max_num_batched_tokens = total tokens). NotImplementedError: an unsupported case (an asv skip)."""
        case = replace(case, quant="cast")  # the plan does not depend on the quantisation
        sup = self.supports(case, platform)
        if not sup:
            raise NotImplementedError(sup.reason)
        entry = self.entry()
        device = platform.device if not self.bypass_gate else torch.device("cpu")
        cu = torch.tensor(case.cu_seqlens(), dtype=torch.int32)
        entry.workspace.init_workspace_manager(device)
        try:
            st = self._setup(entry, case.num_heads, 1.0, cu, device, lock=False)
            with self._aiter_for_vllm():
                samples = [st.build_s] + [_timed_build(st.builder, cu, device)[1] for _ in range(repeats - 1)]
        finally:
            entry.workspace.reset_workspace_manager()
        return {"planner_samples_s": samples, "num_partials": st.num_partials, "workspace_bytes": st.reserved_bytes,
                "reserved_workspace_bytes": st.reserved_bytes, "num_head_k": st.num_head_k}
