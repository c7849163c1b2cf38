"""Benchmark cases: a ragged prefill batch, a context chunk or a prefix-cached prefill, plus quantisation,
distribution and seed, named by a short stable id (an asv parameter; grammar: docs/usage.md, "Cases",
and :data:`_ID_HELP`). Ids that have published results are never changed or reused."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from mla_fp8_bench.problem.shapes import DEFAULT_NUM_HEADS, cu_seqlens_of

QUANT_MODES = ("per_tensor", "cast")
DISTRIBUTIONS = ("normal", "outlier", "mla", "const")

#: Most query tokens (and, separately, key tokens) of one case: AITER's 32-bit buffer descriptors limit bf16
#: output to ``T*H*256 < 2**32`` (1 048 576 tokens at H=16).
MAX_TOTAL_TOKENS = 1 << 20
MAX_NUM_HEADS = 1024


@dataclass(frozen=True)
class CaseKind:
    """What a case computes. Per sequence the keys are its cached context keys (seen whole, when
    ``context``) then its new keys (seen when ``new_keys``, causally when ``causal``: bottom-right, query
    ``i`` sees key ``j`` iff ``j <= kv_len - q_len + i``). Kinds with context run only where
    ``Backend.supports_kind`` says yes, and their LSE is compared on every row. ``name`` is
    ``Case.family``; ``id_lead`` prefixes the ids of a kind without context (``""``: none); ``back_to_back``:
    the case's batches (``Case.batch_sizes``) are planned and launched one after another without a host sync."""

    name: str
    context: bool
    new_keys: bool = True
    causal: bool = True
    id_lead: str = ""
    back_to_back: bool = False

    @property
    def same_q_kv(self) -> bool:
        """q_len == kv_len per sequence: one ``cu_seqlens`` serves queries and keys."""
        return not self.context

    @property
    def composed(self) -> bool:
        """A new-vs-new and a new-vs-context call merged by LSE, as vLLM computes prefix-cached prefill."""
        return self.context and self.new_keys

    def kv_lens(self, seq_lens: tuple[int, ...], context_lens: tuple[int, ...]) -> tuple[int, ...]:
        """Per-sequence key counts: context keys (if seen) plus new keys (if seen)."""
        return tuple(c + q * self.new_keys for c, q in zip(context_lens, seq_lens)) if self.context else seq_lens


#: Case kinds by name: ``prefill`` (q_len == kv_len, causal), ``ctx`` (a context chunk: new queries over
#: cached keys, non-causal), ``prefix`` (prefix-cached prefill: a causal and a ctx piece merged by LSE), ``b2b``
#: (prefill batches of different shapes back to back: each output is its batch's own prefill).
KINDS: dict[str, CaseKind] = {k.name: k for k in (
    CaseKind("prefill", context=False),
    CaseKind("ctx", context=True, new_keys=False, causal=False),
    CaseKind("prefix", context=True),
    CaseKind("b2b", context=False, id_lead="b2b", back_to_back=True),
)}

#: Most decimal digits a length, count, head count or seed may have in an id (refused before any work).
_MAX_DIGITS = 9


class CaseError(ValueError):
    """A case id or case field is invalid. The message names the bad value and the allowed ones."""


def _check_lens(lens: tuple, what: str, minimum: int) -> None:
    for s in lens:
        if not isinstance(s, int) or isinstance(s, bool) or s < minimum:
            raise CaseError(f"{what} {s!r} is invalid: every {what} must be an integer >= {minimum}")


@dataclass(frozen=True)
class Case:
    """One benchmark case: a ragged prefill batch, a context chunk or a prefix-cached prefill. CaseError
    on any invalid field, or more than :data:`MAX_TOTAL_TOKENS` query or key tokens."""

    seq_lens: tuple[int, ...]  # per-sequence query token counts (q_len; == kv_len for prefill), each >= 1
    num_heads: int = DEFAULT_NUM_HEADS  # query heads == kv heads (MLA after kv_b_proj is MHA)
    quant: str = "per_tensor"  # scale = amax/448 with a saturating clamp (AITER's op test), or "cast" (vLLM's)
    dist: str = "normal"  # one of DISTRIBUTIONS (problem/inputs.py)
    seed: int = 0
    context_lens: tuple[int, ...] = ()  # per-sequence cached context tokens (>= 0, one >= 1) for ctx/prefix
    family: str = "prefill"  # the name of its kind, a key of KINDS
    batch_sizes: tuple[int, ...] = ()  # b2b: sequences per batch, in launch order (>= 2 batches)

    def __post_init__(self) -> None:
        lens, ctx, sizes = tuple(self.seq_lens), tuple(self.context_lens), tuple(self.batch_sizes)
        for name, value in (("seq_lens", lens), ("context_lens", ctx), ("batch_sizes", sizes)):
            object.__setattr__(self, name, value)
        if not lens:
            raise CaseError("empty batch: seq_lens must hold at least one sequence length")
        _check_lens(lens, "seq_len", 1)
        self._check_family(lens, ctx)
        if self.kind.back_to_back != bool(sizes) or sizes and (len(sizes) < 2 or min(sizes) < 1
                                                               or sum(sizes) != len(lens)):
            raise CaseError(f"batch_sizes {list(sizes)} is invalid for a {self.family} case: a b2b case splits its "
                            f"{len(lens)} sequences into >= 2 batches of >= 1 sequence, other kinds have none")
        if sum(lens) > MAX_TOTAL_TOKENS:
            raise CaseError(f"total tokens {sum(lens)} exceed the supported maximum {MAX_TOTAL_TOKENS}")
        if self.total_kv_tokens > MAX_TOTAL_TOKENS:
            raise CaseError(f"total key tokens {self.total_kv_tokens} exceed the supported maximum {MAX_TOTAL_TOKENS}")
        if not isinstance(self.num_heads, int) or not 1 <= self.num_heads <= MAX_NUM_HEADS:
            raise CaseError(f"num_heads {self.num_heads!r} is invalid: allowed 1..{MAX_NUM_HEADS}")
        if self.quant not in QUANT_MODES:
            raise CaseError(f"quant mode {self.quant!r} is unknown: allowed {', '.join(QUANT_MODES)}")
        if self.dist not in DISTRIBUTIONS:
            raise CaseError(f"distribution {self.dist!r} is unknown: allowed {', '.join(DISTRIBUTIONS)}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise CaseError(f"seed {self.seed!r} is invalid: must be an integer >= 0")

    def _check_family(self, lens: tuple[int, ...], ctx: tuple[int, ...]) -> None:
        if self.family not in KINDS:
            raise CaseError(f"case family {self.family!r} is unknown: allowed {', '.join(KINDS)}")
        if not self.kind.context:
            if ctx:
                context_kinds = " or ".join(repr(k.name) for k in KINDS.values() if k.context)
                raise CaseError(f"context_lens {list(ctx)} given for a {self.family} case: use family {context_kinds}")
            return
        if len(ctx) != len(lens):
            raise CaseError(f"context_lens {list(ctx)} must hold one length per sequence ({len(lens)} sequences)")
        _check_lens(ctx, "context_len", 0)
        if not any(ctx):
            raise CaseError(f"a {self.family} case needs at least one context_len >= 1; got {list(ctx)} "
                            "(without cached context it is a plain prefill: s<Q> / ragged-...)")

    kind = property(lambda self: KINDS[self.family])
    causal = property(lambda self: self.kind.causal)  # bottom-right; True for prefill and prefix, False for ctx
    batch_size = property(lambda self: len(self.seq_lens))
    total_tokens = property(lambda self: sum(self.seq_lens))
    max_seq_len = property(lambda self: max(self.seq_lens))
    total_kv_tokens = property(lambda self: sum(self.kv_lens))
    max_kv_len = property(lambda self: max(self.kv_lens))

    def batches(self) -> list[tuple[int, ...]]:
        """The seq_lens of each batch launched back to back (``b2b``), else of the one batch."""
        ends = list(itertools.accumulate(self.batch_sizes or (len(self.seq_lens),)))
        return [self.seq_lens[a:b] for a, b in zip([0, *ends], ends)]

    @property
    def kv_lens(self) -> tuple[int, ...]:
        """Per-sequence key counts: q_len (prefill), context_len (ctx), context_len + q_len (prefix)."""
        return self.kind.kv_lens(self.seq_lens, self.context_lens)

    def cu_seqlens_q(self) -> list[int]:
        """Query starts ``[0, q0, q0+q1, ...]`` (qo_indptr, length B+1)."""
        return cu_seqlens_of(self.seq_lens)

    def cu_seqlens_kv(self) -> list[int]:
        """Key starts ``[0, kv0, kv0+kv1, ...]`` (kv_indptr, length B+1)."""
        return cu_seqlens_of(self.kv_lens)

    def cu_seqlens(self) -> list[int]:
        """Sequence starts where qo_indptr == kv_indptr; CaseError for ``ctx``/``prefix`` cases."""
        if not self.kind.same_q_kv:
            raise CaseError(f"cu_seqlens() is defined for prefill cases (q_len == kv_len), not for {self.family} "
                            f"case {self.id}: use cu_seqlens_q() / cu_seqlens_kv()")
        return cu_seqlens_of(self.seq_lens)

    @property
    def id(self) -> str:
        return format_case_id(self)


def _format_runs(items: tuple) -> str:
    """Run-length ``-``-joined items: equal neighbours become ``<item>x<n>``."""
    runs = ((item, len(list(group))) for item, group in itertools.groupby(items))
    return "-".join(f"{item}x{n}" if n > 1 else str(item) for item, n in runs)


def _format_base(case: Case) -> str:
    if not case.kind.context:
        lead = f"{case.kind.id_lead}-" if case.kind.id_lead else ""
        return lead + "-".join(f"s{b[0]}" if len(b) == 1 else "ragged-" + _format_runs(b) for b in case.batches())
    if case.batch_size == 1:
        return f"{case.family}{case.context_lens[0]}-q{case.seq_lens[0]}"
    pairs = tuple(f"{c}q{q}" for c, q in zip(case.context_lens, case.seq_lens))
    return f"{case.family}-ragged-" + _format_runs(pairs)


def format_case_id(case: Case) -> str:
    """Build the id of ``case``; :func:`parse_case_id` inverts it."""
    sfx = (f"h{case.num_heads}" if case.num_heads != DEFAULT_NUM_HEADS else "",
           case.quant if case.quant != "per_tensor" else "", case.dist if case.dist != "normal" else "",
           f"seed{case.seed}" if case.seed != 0 else "")
    return "-".join([_format_base(case), *filter(None, sfx)])


_ID_HELP = (
    "expected 's<seq_len>', 'ragged-<len>[x<count>]-...', 'ctx<C>-q<Q>', 'prefix<C>-q<Q>', "
    "'ctx-ragged-<C>q<Q>[x<count>]-...' / 'prefix-ragged-...' or 'b2b-' and >= 2 batches 's<S>' / 'ragged-...', "
    "followed by optional suffixes '-h<heads>', '-cast', '-outlier'|'-mla'|'-const', '-seed<n>' (e.g. s4096, "
    "s4096-h128, ragged-6992-6896-2495, ragged-4096x4-cast, ctx1024-q256, prefix1024-q300-seed1, "
    "prefix-ragged-1024q256-0q300, b2b-s255-ragged-218-215-78-ragged-128x4)"
)


def _num(tok: str, case_id: str) -> int:
    """A decimal token of an id, refused (CaseError) when longer than :data:`_MAX_DIGITS` digits."""
    if len(tok) > _MAX_DIGITS:
        raise CaseError(f"case id {case_id!r}: number {tok[:20]!r}{'...' if len(tok) > 20 else ''} is too large "
                        f"(at most {_MAX_DIGITS} digits; cases are limited to {MAX_TOTAL_TOKENS} tokens)")
    return int(tok)


def _ragged_runs(rest: list[str], item: str, case_id: str) -> list[tuple[int, ...]]:
    """Pop the leading ``<item>[x<count>]`` tokens of ``rest`` (``item``: a regex of ``q``-separated numbers):
    one tuple of numbers per sequence, repeats expanded; CaseError for a count < 1 or too many sequences."""
    out: list[tuple[int, ...]] = []
    while rest and re.fullmatch(rf"{item}(x\d+)?", rest[0]):
        tok = rest.pop(0)
        body, _, count = tok.partition("x")
        n = _num(count, case_id) if count else 1
        if n < 1:
            raise CaseError(f"case id {case_id!r}: repeat count in {tok!r} must be >= 1")
        if len(out) + n > MAX_TOTAL_TOKENS:
            raise CaseError(f"case id {case_id!r}: {tok!r} makes more than {MAX_TOTAL_TOKENS} tokens")
        out += [tuple(_num(x, case_id) for x in body.split("q"))] * n
    return out


def _parse_chunk_base(tokens: list[str], case_id: str) -> tuple[dict, list[str]] | None:
    """Parse the base of a ``ctx``/``prefix`` id; None if ``tokens`` do not start one."""
    names = [k.name for k in KINDS.values() if k.context]
    m = re.fullmatch(rf"({'|'.join(names)})(\d+)", tokens[0])
    if m:
        if len(tokens) < 2 or not re.fullmatch(r"q\d+", tokens[1]):
            raise CaseError(f"case id {case_id!r}: {tokens[0]!r} must be followed by '-q<Q>' (e.g. {tokens[0]}-q256)")
        return {"family": m.group(1), "context_lens": (_num(m.group(2), case_id),),
                "seq_lens": (_num(tokens[1][1:], case_id),)}, tokens[2:]
    if tokens[0] not in names:
        return None
    if len(tokens) < 2 or tokens[1] != "ragged":
        raise CaseError(f"case id {case_id!r} is invalid: {_ID_HELP}")
    rest = tokens[2:]
    runs = _ragged_runs(rest, r"\d+q\d+", case_id)
    if not runs:
        raise CaseError(f"case id {case_id!r} has no '<C>q<Q>' sequences (empty batch): {_ID_HELP}")
    return {"family": tokens[0], "context_lens": tuple(c for c, _ in runs), "seq_lens": tuple(q for _, q in runs)}, rest


def parse_case_id(case_id: str) -> Case:
    """Parse a case id (see module docstring); CaseError names the bad id and the accepted grammar."""
    if not isinstance(case_id, str) or not case_id:
        raise CaseError(f"case id {case_id!r} is invalid: {_ID_HELP}")
    tokens = case_id.split("-")
    kw: dict = {}
    leads = {k.id_lead: k.name for k in KINDS.values() if k.id_lead and not k.context}
    if len(tokens) > 1 and tokens[0] in leads:
        kw["family"] = leads[tokens.pop(0)]
    chunk = _parse_chunk_base(tokens, case_id)
    if chunk is not None:
        kw, rest = chunk
    elif re.fullmatch(r"s\d+|ragged", tokens[0]):
        rest, batches, b2b = tokens, [], KINDS[kw.get("family", "prefill")].back_to_back
        while rest and re.fullmatch(r"s\d+|ragged", rest[0]) and (b2b or not batches):  # b2b: >= 2 batches
            tok = rest.pop(0)
            batches.append(tuple(n for (n,) in _ragged_runs(rest, r"\d+", case_id)) if tok == "ragged"
                           else (_num(tok[1:], case_id),))
            if not batches[-1]:
                raise CaseError(f"case id {case_id!r} has no sequence lengths (empty batch): {_ID_HELP}")
        kw.update(seq_lens=sum(batches, ()), batch_sizes=tuple(map(len, batches)) if b2b else ())
    else:
        raise CaseError(f"case id {case_id!r} is invalid: {_ID_HELP}")
    for tok in rest:
        if re.fullmatch(r"h\d+", tok) and "num_heads" not in kw:
            kw["num_heads"] = _num(tok[1:], case_id)
        elif tok == "cast" and "quant" not in kw:
            kw["quant"] = "cast"
        elif tok in DISTRIBUTIONS and tok != "normal" and "dist" not in kw:
            kw["dist"] = tok
        elif re.fullmatch(r"seed\d+", tok) and "seed" not in kw:
            kw["seed"] = _num(tok[4:], case_id)
        else:
            raise CaseError(f"case id {case_id!r}: suffix {tok!r} is not recognised: {_ID_HELP}")
    case = Case(kw.pop("seq_lens"), **kw)
    if case.id != case_id:
        raise CaseError(f"case id {case_id!r} is not canonical: write it as {case.id!r}")
    return case


# named suites
#: The default seq_len sweep. Devices cap it: see :func:`default_sweep`.
SWEEP_SEQ_LENS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
#: Largest seq_len of the default sweep per device kind. The CPU cap keeps a full asv run within
#: minutes on a 2-core machine (the float64 reference and the emulator are O(S^2)).
SWEEP_CAPS = {"cpu": 2048, "cuda": 32768}

#: Per-GPU head counts models serve: DeepSeek-V3/R1 (128 heads) at TP8/TP4/TP2 16/32/64, Kimi-K2 at TP8 8,
#: Kimi-K3 at TP8/TP4 12/24 (vLLM pads 12 -> 16 and 24 -> 32).
SERVING_HEADS = (8, 12, 16, 24, 32, 64)
_RAGGED = (6992, 6896, 2495)  # vLLM #58886's mixed batch


def _cast_ids(batches, heads=(DEFAULT_NUM_HEADS,)) -> tuple[str, ...]:
    return tuple(Case(b, num_heads=h, quant="cast").id for b in batches for h in heads)


SUITES: dict[str, tuple[str, ...]] = {
    "sweep": tuple(f"s{s}" for s in SWEEP_SEQ_LENS),
    "tile-edges": ("s255", "s256", "s257", "s511", "s512", "s513"),
    "ragged": ("ragged-6992-6896-2495", "ragged-4096x4", "s8175"),
    "aiter-odd": ("s21", "s1200", "s3200", "s5200", "s10000"),
    "edge": ("s1", "s255", "s256", "s257", "ragged-1x120-8000", "ragged-16384x4-4096", "s512-h1", "s512-h8",
             "s512-h12", "s512-h24", "s512-h32", "s512-h64", "s512-h128", "s512-cast-outlier", "s512-const"),
    "short-prompt": ("ragged-603-640-655-698",),
    # vLLM's async-scheduling test batches back to back (plan buffers rewritten under a running kernel), and
    # the same structure at 1/32 for the CPU emulation
    "b2b": ("b2b-s8175-ragged-6992-6896-2495-ragged-4096x4", "b2b-s255-ragged-218-215-78-ragged-128x4"),
    # prefix-cached prefill: context chunks (non-causal) and whole prefix prefills (LSE merge)
    "prefix": ("ctx1024-q256", "prefix1024-q300", "ctx-ragged-1024q256-100q64", "prefix-ragged-1024q256-100q50",
               "prefix-ragged-2048q128-0q300"),
    # unsplit tiles under pre-#3606 AITER (no final_lse) at 16 heads on 256 CUs: their merge is wrong before
    # v0.1.22 (a context of one 128-key block is never split, nor are short new-token pieces)
    "lse-gap": ("ctx100-q64", "ctx-ragged-1024q256-100q64", "prefix256-q100", "prefix1024-q100",
                "prefix-ragged-1024q256-100q50"),
    # what vLLM hands its entry (bf16 cast at unit scale): the sweep, the ragged batches, s8175
    "sweep-cast": _cast_ids([(s,) for s in SWEEP_SEQ_LENS] + [_RAGGED, (4096,) * 4, (8175,)]),
    "serving-heads": _cast_ids([(512,), (4096,), _RAGGED], SERVING_HEADS),
}


def default_sweep(device_type: str, cap: int | None = None) -> tuple[tuple[str, ...], str]:
    """``(case ids, where it stops and why)`` of the default sweep on ``device_type`` (``"cpu"``, ``"cuda"``)
    capped at :data:`SWEEP_CAPS` or ``cap`` tokens; CaseError on an unknown device type."""
    if device_type not in SWEEP_CAPS:
        raise CaseError(f"device type {device_type!r} is unknown: allowed {', '.join(SWEEP_CAPS)}")
    limit = SWEEP_CAPS[device_type] if cap is None else cap
    why = " (the float64 reference and the CPU emulator are O(seq_len^2))" if device_type == "cpu" else ""
    ids = tuple(f"s{s}" for s in SWEEP_SEQ_LENS if s <= limit)
    return ids, f"default sweep on {device_type} stops at seq_len {limit}{why}"


def resolve_cases(specs: list[str] | tuple[str, ...]) -> list[Case]:
    """Expand suite names (``sweep``, ``ragged``, ...) and case ids into cases, de-duplicated in order;
    CaseError for an unknown id or suite name (lists the suites)."""
    out: dict[str, Case] = {}
    for spec in specs:
        if spec in SUITES:
            for cid in SUITES[spec]:
                out.setdefault(cid, parse_case_id(cid))
            continue
        try:
            case = parse_case_id(spec)
        except CaseError as exc:
            if "is invalid: expected" in str(exc):  # not id-shaped at all: maybe a mistyped suite name
                raise CaseError(f"{exc}; or a suite name: {', '.join(SUITES)}") from None
            raise
        out.setdefault(case.id, case)
    return list(out.values())
