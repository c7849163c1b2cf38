"""cuDNN fused SDPA (``nvidia-cudnn-frontend``, imported lazily): ``cudnn-fp8`` and its bf16 twin. q/k/v are
BSHD views of the packed ``[T, H, D]`` tensors, ragged offsets for batches. On Hopper the FP8 forward's e4m3
output is dequantised inside the timed, host-sync free ``run()`` (``extras["cudnn_output"]``)."""

from __future__ import annotations

from importlib import import_module
from typing import Any, ClassVar

import torch

from mla_fp8_bench.backends.base import Backend, BackendUnavailable, CaseUnsupported, Prepared, Verdict
from mla_fp8_bench.measure.devices import PlatformInfo
from mla_fp8_bench.peers import first_line, load_once, loadable
from mla_fp8_bench.problem.inputs import CaseInputs

CUDNN_DIST = "nvidia-cudnn-frontend"
INSTALL_HINT = f"pip install --no-deps {CUDNN_DIST}"
#: Smallest cuDNN backend with FP8 SDPA forward on Hopper, and one without it (the cuDNN support matrix).
MIN_BACKEND, BAD_BACKENDS = 90100, (91000,)
E4M3_MAX = 448.0  # e4m3fn's largest finite value: P (in [0, 1]) is scaled by this before the cast

_cache: dict[str, Any] = {}


def load_cudnn() -> Any:
    """The module ``cudnn`` (cached); BackendUnavailable when missing, failing or without FP8 SDPA."""
    return load_once(_cache, "mod", _load)


def _load() -> Any:
    try:
        mod = import_module("cudnn")
        ver = int(mod.backend_version())
    except ModuleNotFoundError:
        raise BackendUnavailable(f"{CUDNN_DIST} is not installed: {INSTALL_HINT}") from None
    except Exception as exc:  # noqa: BLE001 - any failing import is "unavailable", with the reason
        raise BackendUnavailable(f"{CUDNN_DIST} is installed but importing it failed ({first_line(exc)})") from None
    if ver < MIN_BACKEND or ver in BAD_BACKENDS:
        raise BackendUnavailable(f"cuDNN backend {ver} has no FP8 SDPA forward on Hopper: needs >= 9.1.0, not 9.10.0")
    return mod


def _bshd(x: torch.Tensor, batch: int, max_s: int) -> tuple[list[int], list[int]]:
    _, h, d = x.shape
    return [batch, h, max_s, d], [max_s * h * d, d, h * d, 1]


def _aux(graph, pack: dict, name: str, value: torch.Tensor, data_type):
    t = graph.tensor(name=name, dim=list(value.shape), stride=[1, 1, 1, 1], data_type=data_type)
    pack[t] = value
    return t


def _ragged(graph, dt, pack: dict, t, name: str, cu: torch.Tensor, x: torch.Tensor) -> None:
    off = (cu * x.shape[1] * x.shape[2]).to(device=x.device).reshape(-1, 1, 1, 1).contiguous()
    t.set_ragged_offset(_aux(graph, pack, f"off_{name}", off, dt.INT64))


def _inference(node, *args, **kw):
    """``node(*args, generate_stats=False, **kw)``; frontends before ``generate_stats`` take ``is_inference``."""
    try:
        return node(*args, generate_stats=False, **kw)
    except TypeError:
        return node(*args, is_inference=True, **kw)


class _CudnnBase(Backend):
    context_chunks: ClassVar[Verdict] = Verdict.no("the cuDNN backends do not return LSE yet (cuDNN's ragged Stats "
                                                   "output is not wired), which ctx and prefix cases need")

    def availability(self, platform: PlatformInfo) -> Verdict:
        arch = str(platform.arch)
        major = int("".join(c for c in arch[3:] if c.isdigit()) or 0) if arch.startswith("sm_") else 0
        if platform.vendor != "cuda" or major < 90:
            return Verdict.no(f"needs an NVIDIA Hopper (sm_90) or newer GPU; found {platform.describe()}")
        return loadable(load_cudnn)

    def prepare(self, inputs: CaseInputs) -> Prepared:
        if inputs.device.type != "cuda":
            raise BackendUnavailable(f"needs an NVIDIA GPU; found {inputs.device.type}")
        cudnn = load_cudnn()
        q, k, v = self._tensors(inputs)
        handle, state = cudnn.create_handle(), {"pack": {}, "fp8_out": False}
        try:
            graph, out = self._build(cudnn, handle, q, k, v, inputs, state)
        except Exception as exc:  # noqa: BLE001 - cuDNN's refusal is the reason, quoted
            raise CaseUnsupported(f"cuDNN {cudnn.backend_version()} cannot build {self.name} for {inputs.case.id} "
                                  f"(d_qk {q.shape[-1]} / d_v {v.shape[-1]}, batch {inputs.case.batch_size}, "
                                  f"{inputs.case.family}): {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
                                  ) from None
        ws = torch.empty(max(int(graph.get_workspace_size()), 1), dtype=torch.uint8, device=inputs.device)
        pack, dequant = state["pack"], state.get("dequant")

        def run() -> torch.Tensor:
            cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream(inputs.device).cuda_stream)
            graph.execute(pack, ws, handle=handle)
            return dequant(out) if dequant is not None else out

        return Prepared(run=run, graph_capturable=True, timing_scope="kernel", extras={
            "cudnn_backend_version": int(cudnn.backend_version()),
            "cudnn_frontend_version": getattr(cudnn, "__version__", None),
            "cudnn_output": state.get("output_note", "bf16")})

    def _build(self, cudnn, handle, q, k, v, inputs, state):
        dev, pack, dt = inputs.device, state["pack"], cudnn.data_type
        cu_q, cu_kv = inputs.cu_seqlens_q_cpu.to(torch.int64), inputs.cu_seqlens_kv_cpu.to(torch.int64)
        batch, max_q, max_kv = int(cu_q.numel()) - 1, int(inputs.max_seqlen_q), int(inputs.max_seqlen_kv)
        io = dt.FP8_E4M3 if self.fp8 else dt.BFLOAT16
        graph = cudnn.pygraph(io_data_type=io, intermediate_data_type=dt.FLOAT, compute_data_type=dt.FLOAT,
                              handle=handle)
        tensors = []
        for name, x, cu, s in (("q", q, cu_q, max_q), ("k", k, cu_kv, max_kv), ("v", v, cu_kv, max_kv)):
            t = graph.tensor(name=name, dim=_bshd(x, batch, s)[0], stride=_bshd(x, batch, s)[1], data_type=io)
            if batch > 1:
                _ragged(graph, dt, pack, t, name, cu, x)
            pack[t] = x
            tensors.append(t)
        mask_kw: dict[str, Any] = {}
        if inputs.causal:
            mask_kw["use_causal_mask" if inputs.case.kind.same_q_kv else "use_causal_mask_bottom_right"] = True
        if batch > 1:
            for name, cu in (("q", cu_q), ("kv", cu_kv)):
                lens = (cu[1:] - cu[:-1]).to(device=dev, dtype=torch.int32).reshape(-1, 1, 1, 1).contiguous()
                mask_kw[f"seq_len_{name}"] = _aux(graph, pack, f"seq_{name}", lens, dt.INT32)
            mask_kw["use_padding_mask"] = True
        o_t = self._node(cudnn, graph, *tensors, mask_kw, inputs, state)
        out = torch.empty(q.shape[0], q.shape[1], v.shape[2], device=dev,
                          dtype=torch.float8_e4m3fn if state["fp8_out"] else torch.bfloat16)
        dims, strides = _bshd(out, batch, max_q)
        o_t.set_output(True).set_dim(dims).set_stride(strides).set_data_type(dt.FP8_E4M3 if state["fp8_out"]
                                                                             else dt.BFLOAT16)
        if batch > 1:
            _ragged(graph, dt, pack, o_t, "o", cu_q, out)
        pack[o_t] = out
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        graph.check_support()
        graph.build_plans()
        return graph, out


class CudnnFp8(_CudnnBase):
    name = "cudnn-fp8"
    description = "cuDNN fused FP8 SDPA (nvidia-cudnn-frontend sdpa_fp8): e4m3 in, per-tensor descales (Hopper peer)"
    fp8 = True

    def supports(self, case, platform: PlatformInfo) -> Verdict:
        if platform.fp8_dtype != torch.float8_e4m3fn:
            return Verdict.no(f"cuDNN FP8 SDPA takes float8_e4m3fn only, not {platform.fp8_dtype}")
        return Verdict.yes()

    def _tensors(self, inputs: CaseInputs):
        return (inputs.q8.data.contiguous(), inputs.k8.data.contiguous(), inputs.v8.data.contiguous())

    def _node(self, cudnn, graph, tq, tk, tv, mask_kw, inputs, state):
        dev, pack, f32 = inputs.device, state["pack"], cudnn.data_type.FLOAT
        dv, one = inputs.v8.descale.to(device=dev, dtype=torch.float32), torch.ones(1, device=dev)
        sc = [_aux(graph, pack, n, x.to(torch.float32).reshape(1, 1, 1, 1).contiguous(), f32)
              for n, x in (("descale_q", inputs.q8.descale.to(dev)), ("descale_k", inputs.k8.descale.to(dev)),
                           ("descale_v", dv), ("descale_s", one / E4M3_MAX), ("scale_s", one * E4M3_MAX),
                           ("scale_o", 1.0 / dv))]
        o, _stats, amax_s, amax_o = _inference(graph.sdpa_fp8, tq, tk, tv, *sc, name="sdpa_fp8",
                                               attn_scale=float(inputs.softmax_scale), **mask_kw)
        for a in (amax_s, amax_o):
            a.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(f32)
            pack[a] = torch.empty(1, 1, 1, 1, dtype=torch.float32, device=dev)
        state["fp8_out"] = torch.cuda.get_device_capability(dev)[0] < 10
        if state["fp8_out"]:
            state["output_note"] = ("e4m3 (Hopper restriction: FP8 forward with bf16 output needs Blackwell and "
                                    "cuDNN >= 9.13), dequantised to bf16 inside run()")
            state["dequant"] = lambda out: (out.to(torch.float32) * dv).to(torch.bfloat16)
        return o


class CudnnBf16(_CudnnBase):
    name = "cudnn-bf16"
    description = "cuDNN fused SDPA bf16 (nvidia-cudnn-frontend sdpa) on the bf16 inputs"
    fp8 = False

    def _tensors(self, inputs: CaseInputs):
        return tuple(x.to(torch.bfloat16).contiguous() for x in (inputs.q, inputs.k, inputs.v))

    def _node(self, cudnn, graph, tq, tk, tv, mask_kw, inputs, state):
        return _inference(graph.sdpa, tq, tk, tv, name="sdpa", attn_scale=float(inputs.softmax_scale), **mask_kw)[0]
