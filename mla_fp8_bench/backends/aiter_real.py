"""The AITER persistent-scheduled FP8 MLA prefill: ``get_ps_metadata_v1`` (host planner) ->
``mla_prefill_ps_asm_fwd`` (ASM kernel) -> ``mla_reduce_v1`` (merge of partials), as docs/aiter-contract.md
specifies. One driver (:class:`AiterPsDriver`) runs the real ``aiter`` on gfx950 and the stand-in elsewhere."""

from __future__ import annotations

import itertools
import time
from collections import namedtuple
from dataclasses import replace
from typing import Any

import torch

from mla_fp8_bench.aiter_ps import facts
from mla_fp8_bench.aiter_ps.facts import import_aiter
from mla_fp8_bench.aiter_ps.workspace import used_partial_slots, used_workspace_bytes, workspace_bytes
from mla_fp8_bench.backends.base import Backend, BackendUnavailable, CaseUnsupported, Prepared, Verdict
from mla_fp8_bench.measure.devices import PlatformInfo, synchronize
from mla_fp8_bench.problem.cases import SERVING_HEADS, Case
from mla_fp8_bench.problem.inputs import CaseInputs
from mla_fp8_bench.problem.prefix import prefix_pieces
from mla_fp8_bench.problem.shapes import V_HEAD_DIM, cu_seqlens_of

#: Head counts probed to name what the installed ``mla_reduce_v1`` dispatches when it refuses one.
PROBE_HEADS = (1, 2, 4, 8, 10, 12, 16, 24, 32, 40, 48, 64, 80, 96, 112, 128)


def load_aiter() -> Any:
    """The installed ``aiter`` module; :class:`BackendUnavailable` if it does not import."""
    try:
        return import_aiter()
    except Exception as exc:  # noqa: BLE001
        raise BackendUnavailable(f"cannot import aiter: {type(exc).__name__}: {exc}") from None


def planned_cases(case: Case) -> tuple[Case, ...]:
    """The AITER calls of ``case``, each as a case: a prefix's two pieces, a b2b case's batches (each a prefill
    over its own rows from 0), else the case itself."""
    if case.kind.back_to_back:
        return tuple(replace(case, seq_lens=b, family="prefill", batch_sizes=()) for b in case.batches())
    return prefix_pieces(case) if case.kind.composed else (case,)


#: One kernel + reduce call. ``valid`` (bool ``[T]``): the q rows whose ``final_lse`` the call writes; ``empty``
#: (device bool ``[T]`` or None): rows of sequences with kv_len 0, set to output 0, LSE -inf.
_Piece = namedtuple("_Piece", "qo_indptr kv_indptr kv_page_indices causal max_seqlen_q plan split_data split_lse "
                              "output final_lse valid empty")


def lse_rows(plan: dict[str, Any], total_q: int, reduces_singles: bool) -> torch.Tensor:
    """bool ``[total_q]``: rows whose ``final_lse`` the reduce writes for this plan (groups of one partial
    are reduced from the #3606 reduce on)."""
    valid = torch.zeros(total_q, dtype=torch.bool)
    groups, final_map = plan["reduce_indptr"].cpu().tolist(), plan["reduce_final_map"].cpu().tolist()
    for g in range(min(len(groups) - 1, len(final_map))):
        if groups[g + 1] - groups[g] >= (1 if reduces_singles else 2):
            valid[final_map[g][0] : final_map[g][1]] = True
    return valid


class AiterPsDriver:
    """Drive the PS prefill primitives of ``module`` (real ``aiter`` or the stand-in; ``version`` None if
    unknown). Detected: ``reduce_arity`` (8 or 9), ``planner_revision`` (``*_source``: where each was read),
    ``post_3606``, head support (:meth:`reduce_refusal`, probed on ``device``); ``pass_need_lse`` False is the
    caller fault of leaving it out. BackendUnavailable: a primitive missing, a form not told, a 7-arg reduce."""

    def __init__(self, module: Any, version: tuple[int, int, int] | None = None):
        missing = [p for p in facts.PRIMITIVES if not hasattr(module, p)]
        if missing:
            raise BackendUnavailable(f"aiter lacks {', '.join(missing)} (the PS prefill needs >= v0.1.10.post1)")
        self.m, self.version = module, version
        self.device = torch.device("cpu")  # where head support is probed (the backend's platform device)
        self._refusals: dict[int, str | None] = {}
        reduce, planner = facts.detect_reduce_arity(module, version), facts.detect_planner_revision(module, version)
        for det in (reduce, planner):
            if det.value is None:
                raise BackendUnavailable(f"aiter: {det.source}")
        self.reduce_arity, self.reduce_source = int(reduce.value), reduce.source
        self.planner_revision, self.planner_source = str(planner.value), planner.source
        if self.reduce_arity == 7:
            raise BackendUnavailable(f"aiter's mla_reduce_v1 has the 7-argument (<= v0.1.7) form ({reduce.source}): "
                                     "too old for the PS prefill")
        self.post_3606 = self.planner_revision != facts.PLANNER_PRE_3606
        self.reduce_ints = (facts.Q_TILE, 0) if self.reduce_arity == 9 else (facts.Q_TILE,)
        self.pass_need_lse = True
        self.share_plan_slot = False  # b2b: every batch plans into one buffer slot (a fault, see _back_to_back)

    def detection(self) -> dict[str, str]:
        """What was detected and from where (``mla-fp8-bench env`` prints it)."""
        ok = [h for h in SERVING_HEADS if self.reduce_refusal(h) is None]
        return {"mla_reduce_v1": f"{self.reduce_arity}-argument form ({self.reduce_source})",
                "get_ps_metadata_v1": f"{self.planner_revision} planner ({self.planner_source})",
                "reduce heads": f"{ok} of the serving counts {list(SERVING_HEADS)} (probed on {self.device}; "
                                f"AITER reports {facts.format_version(self.version)})"}

    def reduce_refusal(self, num_heads: int) -> str | None:
        """None when the installed ``mla_reduce_v1`` runs a one-group reduce of two partials at ``num_heads``
        (v_head_dim 128) on :attr:`device`, else its error: head support as the library dispatches it."""
        if num_heads not in self._refusals:
            h, dev = num_heads, self.device
            f32, i32 = dict(dtype=torch.float32, device=dev), dict(dtype=torch.int32, device=dev)
            try:
                self.m.mla_reduce_v1(torch.zeros(2 * facts.Q_TILE, h, V_HEAD_DIM, **f32),
                                     torch.zeros(2 * facts.Q_TILE, h, **f32), torch.tensor([0, 2], **i32),
                                     torch.tensor([[0, 1]], **i32), torch.tensor([0, facts.Q_TILE], **i32),
                                     *self.reduce_ints, torch.empty(1, h, V_HEAD_DIM, dtype=torch.bfloat16, device=dev),
                                     torch.empty(1, h, **f32))
                synchronize(self.device)
                self._refusals[num_heads] = None
            except Exception as exc:  # noqa: BLE001 - a refusal, whatever the library raises
                self._refusals[num_heads] = f"{type(exc).__name__}: {str(exc).strip()[:100]}"
        return self._refusals[num_heads]

    def supports_heads(self, num_heads: int) -> Verdict:
        why = self.reduce_refusal(num_heads)
        if why is None:
            return Verdict.yes()
        ok = [h for h in PROBE_HEADS if self.reduce_refusal(h) is None]
        return Verdict.no(f"mla_reduce_v1 of aiter {facts.format_version(self.version)} dispatches num_heads in "
                          f"{ok} for v_head_dim 128 (probed); got {num_heads}: {why}")

    def info_shapes(self, batch: int, num_heads: int, max_qlen: int, max_kvlen: int | None = None,
                    total_qlen: int | None = None) -> list:
        """``get_ps_metadata_info_v1`` for this module; ``max_kvlen`` is passed only to the pre-merge PR
        ref's info function and only when given (a context chunk); ``total_qlen`` (the token budget, vLLM's
        ``max_num_batched_tokens``) only where the installed function takes it, its sizes checked against the
        invariants AITER's op test pins (RuntimeError naming the broken one)."""
        kw: dict[str, Any] = dict(batch_size=batch, num_head_k=num_heads, max_qlen=max_qlen,
                                  qlen_granularity=facts.Q_TILE)
        if self.planner_revision == facts.PLANNER_PR_3606_REF and max_kvlen is not None:
            kw.update(max_kvlen=max_kvlen, kvlen_granularity=facts.KVLEN_GRANULARITY)
        plain = list(self.m.get_ps_metadata_info_v1(**kw))
        if total_qlen is None or "total_qlen" not in facts.info_params(self.m):
            return plain
        budget = list(self.m.get_ps_metadata_info_v1(**kw, total_qlen=total_qlen))
        lengths = [{n: int(shape) if isinstance(shape, int) else int(shape[0]) for n, (shape, _) in
                    zip(facts.BUFFER_NAMES, info)} for info in (budget, plain)]
        bad = facts.total_qlen_violations(*lengths, batch_size=batch, max_qlen=max_qlen, total_qlen=total_qlen,
                                    cu_num=lengths[1]["work_indptr"] - 1)
        if bad:
            raise RuntimeError(f"aiter's get_ps_metadata_info_v1 breaks AITER's sizing invariants: {'; '.join(bad)}")
        return budget

    def alloc(self, info: list, device: torch.device) -> dict[str, torch.Tensor]:
        """The six planner buffers of ``info`` on ``device``, zeroed."""
        return {n: torch.zeros((shape,) if isinstance(shape, int) else tuple(shape), dtype=dt,
                               device=device) for n, (shape, dt) in zip(facts.BUFFER_NAMES, info)}

    def plan(self, cu_seqlens_cpu: torch.Tensor, num_heads: int, device: torch.device, *,
             cu_seqlens_kv_cpu: torch.Tensor | None = None, causal: bool = True,
             need_lse: bool = False, bufs: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
        """Run the host planner on ``[B+1]`` int32 query / key starts (keys default to the queries; ``causal``:
        bottom-right; ``need_lse`` as :attr:`pass_need_lse` allows) into ``bufs`` (a slot of :meth:`alloc`: no
        device sync, ``num_partials`` None) or new info-sized buffers (``total_qlen``: the call's tokens).
        Returns the buffers, ``planner_s``, ``num_partials``, ``info_partial_slots``, ``q_rows``, ``post_3606``
        and ``need_lse`` (None: not passed)."""
        cu_q = cu_seqlens_cpu.to(torch.int32).contiguous()
        cu_kv = cu_q.clone() if cu_seqlens_kv_cpu is None else cu_seqlens_kv_cpu.to(torch.int32).contiguous()
        q_lens, kv_lens = (cu_q[1:] - cu_q[:-1]).contiguous(), (cu_kv[1:] - cu_kv[:-1]).contiguous()
        chunk, slot = not torch.equal(q_lens, kv_lens), bufs is not None
        if bufs is None:
            bufs = self.alloc(self.info_shapes(int(q_lens.numel()), num_heads, int(q_lens.max()),
                                               int(kv_lens.max()) if chunk else None, int(cu_q[-1])), device)
        takes_lse = self.pass_need_lse and self.planner_revision in facts.NEED_LSE_REVISIONS
        extra = {"need_lse": bool(need_lse)} if takes_lse else {}
        t0 = time.perf_counter()
        self.m.get_ps_metadata_v1(cu_q, cu_kv, kv_lens, 1, num_heads, *(bufs[n] for n in facts.BUFFER_NAMES),
                                  qhead_granularity=facts.QHEAD_GRANULARITY, qlen_granularity=facts.Q_TILE,
                                  kvlen_granularity=facts.KVLEN_GRANULARITY, block_size=1, is_causal=bool(causal),
                                  **extra)
        if not slot:
            synchronize(device)
        planner_s = time.perf_counter() - t0
        return {**bufs, "planner_s": planner_s, "num_partials": None if slot else int(bufs["reduce_indptr"][-1].item()),
                "info_partial_slots": bufs["reduce_partial_map"].numel(), "q_rows": int(cu_q[-1]),
                "post_3606": self.post_3606, "need_lse": extra.get("need_lse")}

    def _piece(self, qo_cpu: torch.Tensor, kv_cpu: torch.Tensor, pages: torch.Tensor, causal: bool, need_lse: bool,
               h: int, dv: int, device: torch.device) -> _Piece:
        """Plan one call and allocate its buffers (output and final_lse NaN-poisoned, so unwritten rows show)."""
        plan = self.plan(qo_cpu, h, device, cu_seqlens_kv_cpu=kv_cpu, causal=causal, need_lse=need_lse)
        t = int(qo_cpu[-1])
        rows = used_partial_slots(plan["num_partials"]) * facts.Q_TILE
        q_lens, kv_lens = (qo_cpu[1:] - qo_cpu[:-1]).long(), (kv_cpu[1:] - kv_cpu[:-1]).long()
        empty = torch.repeat_interleave(kv_lens == 0, q_lens, output_size=t)
        return _Piece(
            qo_indptr=qo_cpu.to(device), kv_indptr=kv_cpu.to(device), kv_page_indices=pages, causal=causal,
            max_seqlen_q=int(q_lens.max()), plan=plan,
            split_data=torch.empty(rows, h, dv, dtype=torch.float32, device=device),
            split_lse=torch.empty(rows, h, dtype=torch.float32, device=device),
            output=torch.full((t, h, dv), float("nan"), dtype=torch.bfloat16, device=device),
            final_lse=torch.full((t, h), float("nan"), dtype=torch.float32, device=device),
            valid=lse_rows(plan, t, self.post_3606) | empty,
            empty=empty.to(device) if bool(empty.any()) else None,
        )

    def launch(self, p: _Piece, q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor, scales: list[torch.Tensor],
               softmax_scale: float) -> None:
        """One ``mla_prefill_ps_asm_fwd`` + ``mla_reduce_v1`` (graph-capturable: no host work)."""
        pl = p.plan
        self.m.mla_prefill_ps_asm_fwd(q8, k8, v8, p.qo_indptr, p.kv_indptr, p.kv_page_indices, pl["work_indptr"],
                                      pl["work_info"], p.max_seqlen_q, softmax_scale, p.causal, p.split_data,
                                      p.split_lse, p.output, scales[0], scales[1], scales[2])
        self.m.mla_reduce_v1(p.split_data, p.split_lse, pl["reduce_indptr"], pl["reduce_final_map"],
                             pl["reduce_partial_map"], *self.reduce_ints, p.output, p.final_lse)
        if p.empty is not None:
            p.output.masked_fill_(p.empty[:, None, None], 0.0)
            p.final_lse.masked_fill_(p.empty[:, None], float("-inf"))

    def prepare(self, inputs: CaseInputs) -> Prepared:
        """Plan and allocate the case's call and return it (kernel + reduce); a ``prefix`` case is two such
        calls merged by :meth:`Backend.prepare_case`. CaseUnsupported for inputs not float8_e4m3fn."""
        if inputs.fp8_dtype != torch.float8_e4m3fn:
            raise CaseUnsupported(f"the PS prefill kernel takes float8_e4m3fn only, not {inputs.fp8_dtype}")
        case, dev, kv = inputs.case, inputs.device, inputs.cu_seqlens_kv_cpu
        if case.kind.composed:
            raise ValueError(f"{case.id} is two calls merged by their LSE: run it with Backend.prepare_case")
        q8, k8, v8 = (x.data.contiguous() for x in (inputs.q8, inputs.k8, inputs.v8))
        scales = [x.descale.reshape(1).to(device=dev, dtype=torch.float32).contiguous()
                  for x in (inputs.q8, inputs.k8, inputs.v8)]
        if case.kind.back_to_back:
            return self._back_to_back(inputs, q8, k8, v8, scales)
        pages = torch.arange(int(kv[-1]), dtype=torch.int32, device=dev)
        p = self._piece(inputs.cu_seqlens_q_cpu.to(torch.int32), kv.to(torch.int32), pages, bool(inputs.causal),
                        case.kind.context or inputs.has_context, case.num_heads, int(v8.shape[-1]), dev)

        def run() -> torch.Tensor:
            self.launch(p, q8, k8, v8, scales, inputs.softmax_scale)
            return p.output

        return Prepared(run=run, graph_capturable=dev.type == "cuda", timing_scope="kernel",
                        lse=lambda: (p.final_lse, p.valid), extras=self.plan_extras([p.plan], case))

    def _back_to_back(self, inputs: CaseInputs, q8: torch.Tensor, k8: torch.Tensor, v8: torch.Tensor,
                      scales: list[torch.Tensor]) -> Prepared:
        """``b2b``: each batch planned into its own buffer slot (sized once, as a serving builder does: the most
        sequences, the longest, the most tokens as ``total_qlen``) and launched with no host sync between batches;
        the partials share one workspace. :attr:`share_plan_slot`: one slot for all, the fault vLLM #58887 fixed."""
        case, dev, h, dv = inputs.case, inputs.device, inputs.case.num_heads, int(v8.shape[-1])
        f32 = dict(dtype=torch.float32, device=dev)
        cus = [torch.tensor(c.cu_seqlens_q(), dtype=torch.int32) for c in planned_cases(case)]
        starts = cu_seqlens_of(int(c[-1]) for c in cus)
        info = self.info_shapes(max(case.batch_sizes), h, case.max_seq_len, total_qlen=max(int(c[-1]) for c in cus))
        slots = [self.alloc(info, dev) for _ in cus[: 1 if self.share_plan_slot else None]]
        part = used_partial_slots(slots[0]["reduce_partial_map"].numel()) * facts.Q_TILE
        split = torch.empty(part, h, dv, **f32), torch.empty(part, h, **f32)
        pages = [torch.arange(int(c[-1]), dtype=torch.int32, device=dev) for c in cus]
        out = torch.full((case.total_tokens, h, dv), float("nan"), dtype=torch.bfloat16, device=dev)
        lse = torch.full((case.total_tokens, h), float("nan"), **f32)
        plans, extras = [], {}

        def run() -> torch.Tensor:
            plans.clear()
            for cu, pg, a, b, slot in zip(cus, pages, starts, starts[1:], itertools.cycle(slots)):
                plans.append(self.plan(cu, h, dev, bufs=slot))
                piece = _Piece(cu.to(dev), cu.to(dev), pg, True, int((cu[1:] - cu[:-1]).max()), plans[-1], *split,
                               out[a:b], lse[a:b], valid=torch.empty(0), empty=None)
                self.launch(piece, q8[a:b], k8[a:b], v8[a:b], scales, inputs.softmax_scale)
            for plan in plans:  # after every launch
                plan["num_partials"] = int(plan["reduce_indptr"][-1].item())
            extras.update(self.plan_extras(plans, case))
            return out

        def lse_valid() -> tuple[torch.Tensor, torch.Tensor]:
            return lse, torch.cat([lse_rows(p, p["q_rows"], self.post_3606) for p in plans])

        return Prepared(run=run, graph_capturable=False, timing_scope="call", lse=lse_valid, extras=extras)

    def plan_extras(self, plans: list[dict[str, Any]], case: Case) -> dict[str, Any]:
        """Record extras of a case's plans: planner seconds, partial slots, live and reserved workspace bytes
        (docs/aiter-contract.md#workspace), the reduce form, planner revision and each call's ``need_lse``."""
        h = case.num_heads
        live = sum(used_workspace_bytes(p["num_partials"], p["q_rows"], h).total for p in plans)
        reserved = sum(workspace_bytes(p["info_partial_slots"], p["q_rows"], h).total for p in plans)
        return {"planner_s": sum(p["planner_s"] for p in plans), "num_partials": sum(p["num_partials"] for p in plans),
                "workspace_bytes": live, "reserved_workspace_bytes": reserved, "reduce_arity": self.reduce_arity,
                "aiter_post_3606": self.post_3606, "aiter_planner_revision": self.planner_revision,
                "need_lse": [p["need_lse"] for p in plans]}

    def plan_stats(self, case: Case, device: torch.device, repeats: int = 7) -> dict[str, Any]:
        """Planner seconds per repeat (all calls of ``case`` summed), live partial slots, live and reserved bytes."""
        samples, plans = [], []
        for _ in range(repeats):  # a prefix's two calls both need the LSE
            plans = [self.plan(torch.tensor(c.cu_seqlens_q()), c.num_heads, device, causal=c.causal,
                               cu_seqlens_kv_cpu=torch.tensor(c.cu_seqlens_kv()), need_lse=case.kind.context)
                     for c in planned_cases(case)]
            samples.append(sum(p["planner_s"] for p in plans))
        ex = self.plan_extras(plans, case)
        return {"planner_samples_s": samples, **{k: ex[k] for k in ("num_partials", "workspace_bytes",
                                                                     "reserved_workspace_bytes")}}


def aiter_gate(platform: PlatformInfo) -> Verdict:
    """Yes on gfx950 with a ROCm torch; otherwise no with what was found (gfx942 named as unsupported)."""
    if platform.vendor != "rocm":
        found = platform.arch if platform.vendor == "cuda" else platform.no_gpu()
        return Verdict.no(f"needs an AMD gfx950 GPU with a ROCm build of torch; found {found}")
    if platform.arch != "gfx950":
        gfx942 = ": fp8 mla persistent prefill is not supported on gfx942" if platform.arch == "gfx942" else ""
        return Verdict.no(f"needs gfx950 (MI350/MI355); found {platform.arch}{gfx942}")
    return Verdict.yes()


class AiterPsBackend(Backend):
    """A backend over one :class:`AiterPsDriver` (built on first use by :meth:`make_driver`)."""

    fp8 = True
    context_chunks = Verdict.yes()  # the driver runs non-causal context chunks (q_len < kv_len) with final_lse
    back_to_back = Verdict.yes()  # and b2b batches, each in its own plan slot
    _driver: AiterPsDriver | None = None

    def make_driver(self) -> AiterPsDriver:
        raise NotImplementedError

    def driver(self) -> AiterPsDriver:
        if self._driver is None:
            self._driver = self.make_driver()
        return self._driver

    def detection(self) -> dict[str, str]:
        return self.driver().detection()

    def supports(self, case: Case, platform: PlatformInfo) -> Verdict:
        return self.driver().supports_heads(case.num_heads)

    def prepare(self, inputs: CaseInputs) -> Prepared:
        p = self.driver().prepare(inputs)
        if self.emulation:
            p.graph_capturable = False  # an emulator reads work_info on the host
            p.timing_scope = "emulation"
        return p

    def plan_stats(self, case: Case, platform: PlatformInfo) -> dict[str, Any]:
        return self.driver().plan_stats(case, self.driver().device)  # the platform's where one is driven


class AiterReal(AiterPsBackend):
    name = "aiter"
    description = "AITER mla_prefill_ps_asm_fwd + mla_reduce_v1 (gfx950), planner outside the timed region"

    def make_driver(self) -> AiterPsDriver:
        module = load_aiter()
        return AiterPsDriver(module, facts.aiter_version_of(module))

    def availability(self, platform: PlatformInfo) -> Verdict:
        gate = aiter_gate(platform)
        self.emulation = bool(not gate and self.config.aiter_any_device)  # off gfx950: an emulation, labelled
        if not gate and not self.emulation:
            return gate
        try:
            self.driver().device = platform.device
        except BackendUnavailable as exc:
            return Verdict.no(str(exc))
        return Verdict.yes()

    def prepare(self, inputs: CaseInputs) -> Prepared:
        p = super().prepare(inputs)
        if self.emulation:
            p.extras["aiter_off_device"] = True
        return p
