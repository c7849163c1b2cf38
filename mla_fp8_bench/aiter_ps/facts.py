"""AITER facts the suite relies on, defined once: tiles, ``work_info`` layout, versions, planner revisions and
feature detection (docs/aiter-contract.md#planner-io, #work-info, #versions, #pr-3606). Importing it never
imports ``aiter`` (whose import runs ``rocminfo``); :func:`import_aiter` does."""

from __future__ import annotations

import inspect
import re
from collections import namedtuple
from collections.abc import Callable, Iterable, Mapping
from typing import Any

AITER_DIST = "amd-aiter"  # the distribution name (importlib.metadata)

Q_TILE = 256  # rows of one q-tile: qlen_granularity, the kernel's m32x8 tile, one partial slot
KV_TILE = 128  # keys per inner KV tile of the kernel (n128x1); the planner's KV split granularity
QHEAD_GRANULARITY = 1  # heads per work (the PS prefill is MHA)
KVLEN_GRANULARITY = KV_TILE  # max(128, block_size) at block_size 1 (the binding's default of 1 is wrong)
#: The four ``aiter`` exports the PS FP8 prefill path calls.
PRIMITIVES = ("get_ps_metadata_info_v1", "get_ps_metadata_v1", "mla_prefill_ps_asm_fwd", "mla_reduce_v1")
#: The six planner buffers, in the order ``get_ps_metadata_info_v1`` returns them.
BUFFER_NAMES = ("work_metadata_ptrs", "work_indptr", "work_info", "reduce_indptr", "reduce_final_map",
                "reduce_partial_map")
#: Columns of a ``work_info`` row (AITER ``WorkInfo``, ``csrc/include/ps.h``), int32 each.
WORK_INFO_FIELDS = ("batch_idx", "partial_o_loc", "qo_start", "qo_end", "kv_start", "kv_end", "kv_offset",
                    "q_head_range")
WORK_INFO_COLS = len(WORK_INFO_FIELDS)
MAX_HEADS = 0xFFFF  # q_head_range packs the first and the end head into 16 bits each
INT32_MAX = 2**31 - 1  # the planner's buffers and indptrs are int32
MAX_CU_NUM = 65536  # largest CU count a plan is made for (the planner allocates per-CU work lists)


def pack_q_head_range(first_head: Any, end_head: Any) -> Any:
    """``q_head_range`` of a work: ``first_head | (end_head << 16)`` (end exclusive; ints or int tensors)."""
    return first_head | (end_head << 16)


def unpack_q_head_range(value: int) -> tuple[int, int]:
    """``(first_head, end_head)`` of a packed ``q_head_range``."""
    return value & 0xFFFF, (value >> 16) & 0xFFFF


Version = tuple[int, int, int]

PS_PREFILL_FIRST_VERSION: Version = (0, 1, 10)  # first with the PS prefill (tag v0.1.10.post1)
POST_3606_FIRST_VERSION: Version = (0, 1, 22)  # ROCm/aiter#3606 as merged
NEWEST_MODELLED_VERSION: Version = (0, 1, 22)  # the default emulated version
#: ``mla_reduce_v1``'s argument count by the version that introduced it (9: ``num_kv_splits``, ROCm/aiter#3391).
REDUCE_ARITY_BY_VERSION: tuple[tuple[Version, int], ...] = (((0, 1, 16), 9), ((0, 1, 8), 8), ((0, 0, 0), 7))
#: Head counts ``mla_reduce_v1`` dispatches at ``v_head_dim`` 128, by the version that added them.
REDUCE_HEADS_BY_VERSION: tuple[tuple[Version, tuple[int, ...]], ...] = (
    ((0, 0, 0), (1, 2, 4, 8, 10, 16, 128)), ((0, 1, 11), (32, 64)), ((0, 1, 12), (40,)), ((0, 1, 20), (48, 96)),
)

#: Planner revisions: up to v0.1.21 a tile computed by one work gets no slot and no reduce group; the never
#: released ``refs/pull/3606/merge`` (b97d239) gives every work a slot and its info function takes ``max_kvlen``
#: / ``kvlen_granularity``; ROCm/aiter#3606 as merged adds ``need_lse`` (True: every tile gets a slot); the
#: v0.1.22 planner whose info function takes the optional ``total_qlen`` budget (ROCm/aiter#5759; which
#: release carries it is not established) is told from that signature alone.
PLANNER_PRE_3606, PLANNER_PR_3606_REF, PLANNER_V0_1_22, PLANNER_TOTAL_QLEN = "pre-3606", "pr3606-ref", "v0.1.22", \
    "total-qlen"
PLANNER_REVISIONS = (PLANNER_PRE_3606, PLANNER_PR_3606_REF, PLANNER_V0_1_22, PLANNER_TOTAL_QLEN)
#: Revisions whose ``get_ps_metadata_v1`` takes ``need_lse``.
NEED_LSE_REVISIONS = (PLANNER_V0_1_22, PLANNER_TOTAL_QLEN)

_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:[.+\-_a-zA-Z0-9]*)$")


def parse_aiter_version(v: str | Iterable[int]) -> Version:
    """``"0.1.20.post1"``, ``"v0.1.22"``, ``"0.1.22+rocm7"`` or ``(0, 1, 22)`` -> ``(major, minor, patch)``;
    ValueError for anything else."""
    if isinstance(v, str):
        m = _VERSION_RE.match(v.strip())
        if not m:
            raise ValueError(f"AITER version {v!r} is not MAJOR.MINOR.PATCH (e.g. 0.1.20, 0.1.20.post1, 0.1.22)")
        return int(m.group(1)), int(m.group(2)), int(m.group(3))
    parts = tuple(v) if isinstance(v, (tuple, list)) else ()
    if len(parts) < 3 or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in parts[:3]):
        raise ValueError(f"AITER version {v!r} must be a string or 3 non-negative ints like (0, 1, 22)")
    return parts[0], parts[1], parts[2]


def parse_aiter_version_or_none(v: Any) -> Version | None:
    """:func:`parse_aiter_version`, or None for a missing or unparsable version (e.g. a dev build)."""
    try:
        return None if v is None else parse_aiter_version(v)
    except ValueError:
        return None


def modelled_version(raw: str, what: str) -> Version:
    """The AITER version ``raw`` names, if its PS prefill planner is modelled; ValueError naming ``what``."""
    ver = parse_aiter_version_or_none(raw)
    lo, hi = PS_PREFILL_FIRST_VERSION, NEWEST_MODELLED_VERSION
    if ver is None or not lo <= ver <= hi:
        raise ValueError(f"{what}={raw!r} is invalid: an AITER version MAJOR.MINOR.PATCH[.postN] "
                         f"from {format_version(lo)} to {format_version(hi)} (e.g. 0.1.20, 0.1.20.post1, v0.1.22)")
    return ver


def format_version(v: Version | None) -> str:
    """``(0, 1, 22)`` -> ``"0.1.22"``; None -> ``"unknown"``."""
    return ".".join(map(str, v)) if v is not None else "unknown"


def reduce_heads_for(version: str | Iterable[int] | None) -> frozenset[int]:
    """Head counts ``mla_reduce_v1`` accepts at ``v_head_dim`` 128 for ``version`` (None: newest known)."""
    ver = None if version is None else parse_aiter_version(version)
    return frozenset(h for since, hs in REDUCE_HEADS_BY_VERSION if ver is None or ver >= since for h in hs)


def reduce_arity_for_version(version: str | Iterable[int]) -> int:
    """``mla_reduce_v1`` argument count at ``version``: 7 (<= 0.1.7), 8 (0.1.8 .. 0.1.15.x), 9 (>= 0.1.16)."""
    ver = parse_aiter_version(version)
    return next(n for since, n in REDUCE_ARITY_BY_VERSION if ver >= since)


def planner_revision_for(version: str | Iterable[int]) -> str:
    """The released planner revision at ``version``: :data:`PLANNER_V0_1_22` from 0.1.22, else pre-3606."""
    return PLANNER_V0_1_22 if parse_aiter_version(version) >= POST_3606_FIRST_VERSION else PLANNER_PRE_3606


#: One detected feature: ``value`` (None when it could not be told) and ``source``, where it was read or why not.
Detected = namedtuple("Detected", "value source")


def op_params(module: Any, name: str) -> tuple[tuple[str, ...] | None, str]:
    """``(names, "op schema ns::name")``: parameter names of ``torch.ops.<ns>.<name>.default._schema`` (``ns``:
    ``module.aiter_op_namespace``, else ``aiter``) without AITER's leading ``dummy`` tensor; ``(None, reason)``
    when no such op is registered."""
    import torch

    ns = getattr(module, "aiter_op_namespace", "aiter")
    try:
        schema = getattr(getattr(torch.ops, ns), name).default._schema
    except (AttributeError, RuntimeError) as exc:
        return None, f"no registered op {ns}::{name} ({type(exc).__name__})"
    names = tuple(a.name for a in schema.arguments)
    return names[1:] if names[:1] == ("dummy",) else names, f"op schema {ns}::{name}"


def info_params(module: Any) -> tuple[str, ...]:
    """Parameter names of the pure-Python ``get_ps_metadata_info_v1``; ``()`` if absent or ``(*args, **kwargs)``."""
    try:
        params = list(inspect.signature(module.get_ps_metadata_info_v1).parameters.values())
    except (AttributeError, TypeError, ValueError):
        return ()
    return () if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params) else tuple(p.name for p in params)


def _by_version(version: Any, fact: Callable[[Version], Any], src: str, what: str) -> Detected:
    """``fact`` at ``version`` where no op schema told it (``src``: why), or ``Detected(None, why)``."""
    ver = parse_aiter_version_or_none(version)
    if ver is None:
        return Detected(None, f"{what} cannot be told: {src} and no readable AITER version")
    return Detected(fact(ver), f"facts table at AITER {format_version(ver)} ({src})")


def detect_reduce_arity(module: Any, version: Any = None) -> Detected:
    """The ``mla_reduce_v1`` form of ``module``: 9 (``num_kv_splits``), 8 (``max_seqlen_q`` only) or 7, from
    the registered op schema, else the facts table at ``version``, else ``Detected(None, reason)``."""
    params, src = op_params(module, "mla_reduce_v1")
    if params is None:
        return _by_version(version, reduce_arity_for_version, src, "mla_reduce_v1's form")
    return Detected(9 if "num_kv_splits" in params else 8 if "max_seqlen_q" in params else 7, src)


def detect_planner_revision(module: Any, version: Any = None) -> Detected:
    """The planner revision ``module`` ships: ``need_lse`` in the ``get_ps_metadata_v1`` op schema: v0.1.22, or
    total-qlen with ``total_qlen`` in ``get_ps_metadata_info_v1``; else ``max_kvlen`` there: pr3606-ref; else
    pre-3606. Without a registered planner op: the facts table at ``version``, else ``Detected(None, reason)``."""
    params, src = op_params(module, "get_ps_metadata_v1")
    if params is None:
        return _by_version(version, planner_revision_for, src, "the planner revision")
    info = info_params(module)
    if "need_lse" in params:
        if "total_qlen" in info:
            return Detected(PLANNER_TOTAL_QLEN, f"{src}; total_qlen in get_ps_metadata_info_v1")
        return Detected(PLANNER_V0_1_22, src)
    if "max_kvlen" in info:
        return Detected(PLANNER_PR_3606_REF, f"{src}; max_kvlen in get_ps_metadata_info_v1")
    return Detected(PLANNER_PRE_3606, src)


def effective_version(version: Version | None, reduce_arity: int | None,
                      planner_revision: str | None) -> Version | None:
    """The version to key version-only facts (reduce head sets) on: the larger of ``version`` and the first
    release with the detected features (a source build reports 0.1.0). None when nothing is known."""
    arity_floor = next((since for since, n in REDUCE_ARITY_BY_VERSION if n == reduce_arity and n > 7), None)
    # any planner: the PS prefill exists; the PR ref sits on main after v0.1.20.post1
    revision_floor = None if planner_revision is None else (0, 1, 20) if planner_revision == PLANNER_PR_3606_REF \
        else POST_3606_FIRST_VERSION if planner_revision in NEED_LSE_REVISIONS else PS_PREFILL_FIRST_VERSION
    return max((v for v in (version, arity_floor, revision_floor) if v is not None), default=None)


def dist_version(dist: str) -> str | None:
    """Installed version of distribution ``dist`` (``importlib.metadata``), None if not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def import_aiter() -> Any:
    """Import the real ``aiter`` (only on a ROCm machine: its import runs ``rocminfo``); raises what it raises."""
    import aiter

    return aiter


def aiter_version_of(module: Any) -> Version | None:
    """The AITER version of ``module``: the stand-in's ``aiter_version``, else the installed ``amd-aiter``
    distribution, else ``module.__version__``; None when none parses."""
    given = getattr(module, "aiter_version", None)
    if given is None:
        given = dist_version(AITER_DIST) or getattr(module, "__version__", None)
    return parse_aiter_version_or_none(given)


def total_qlen_violations(budgeted: Mapping[str, int], unbudgeted: Mapping[str, int], *, batch_size: int, max_qlen: int,
                          total_qlen: int, cu_num: int, qlen_granularity: int = Q_TILE) -> list[str]:
    """The ``total_qlen`` invariants AITER's op test pins that buffer leading dims (keyed by buffer name) break,
    one line each: a budget never makes a buffer larger; partial pool rows <= ``max(total_qlen, max_qlen) +
    qlen_granularity*(batch_size + cu_num)``; ``reduce_final_map`` >= ``ceil(max_qlen / qlen_granularity)``."""
    bad = [f"{n} has {budgeted[n]} with total_qlen={total_qlen} but {unbudgeted[n]} without: a budget never"
           " makes a buffer larger" for n in BUFFER_NAMES if budgeted[n] > unbudgeted[n]]
    pool, cap = budgeted["reduce_partial_map"] * qlen_granularity, (
        max(total_qlen, max_qlen) + qlen_granularity * (batch_size + cu_num))
    if pool > cap:
        bad.append(f"reduce_partial_map holds {pool} partial rows with total_qlen={total_qlen}: the pinned bound is"
                   f" max(total_qlen, max_qlen) + {qlen_granularity}*(batch_size + cu_num) = {cap}")
    if budgeted["reduce_final_map"] < (need := -(-max_qlen // qlen_granularity)):
        bad.append(f"reduce_final_map has {budgeted['reduce_final_map']} rows with total_qlen={total_qlen}: needs"
                   f" >= ceil(max_qlen / {qlen_granularity}) = {need}")
    return bad
