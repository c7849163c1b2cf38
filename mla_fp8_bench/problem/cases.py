"""Benchmark cases: a ragged causal prefill batch plus quantisation, distribution and seed.

A case id is a short stable string usable as an asv parameter and on the command line:

* ``s4096`` - one sequence of 4096 tokens at the defaults (16 heads, ``per_tensor``
  quantisation, ``normal`` inputs, seed 0);
* ``ragged-6992-6896-2495`` - a ragged batch, one length per sequence; ``ragged-4096x4`` repeats a
  length (``ragged-1x120-8000`` is 120 sequences of length 1 then one of 8000);
* non-defaults add suffixes, in this order: ``-h<heads>``, ``-cast`` (vLLM's unit-scale cast instead
  of the amax/448 per-tensor scale), ``-outlier`` / ``-mla`` / ``-const`` (input distribution),
  ``-seed<n>``. Example: ``s4096-h128-cast-mla-seed3``.

Ids that have published results are never changed or reused: add new ids, never edit the meaning of
an old one (the asv history of an id must stay one series).

Every sequence is a prefill with ``q_len == kv_len`` and causal (bottom-right aligned) masking.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from mla_fp8_bench.problem.shapes import DEFAULT_NUM_HEADS

QUANT_MODES = ("per_tensor", "cast")
DISTRIBUTIONS = ("normal", "outlier", "mla", "const")
_QUANT_SUFFIX = {"cast": "cast"}
_DIST_SUFFIX = {"outlier": "outlier", "mla": "mla", "const": "const"}

#: Largest number of query tokens in one case. AITER's 32-bit buffer descriptors limit bf16 output to
#: ``T*H*256 < 2**32`` (1 048 576 tokens at H=16); we cap lower to keep references tractable.
MAX_TOTAL_TOKENS = 1 << 20
MAX_NUM_HEADS = 1024


class CaseError(ValueError):
    """A case id or case field is invalid. The message names the bad value and the allowed ones."""


@dataclass(frozen=True)
class Case:
    """One benchmark case: a causal ragged prefill batch.

    Attributes:
        seq_lens: per-sequence token counts (q_len == kv_len), each >= 1.
        num_heads: query heads == kv heads (MLA after ``kv_b_proj`` is MHA), >= 1.
        quant: ``"per_tensor"`` (scale = amax/448, saturating clamp; AITER's op test) or ``"cast"``
            (plain cast at unit scale; vLLM's ``_mla_fp8_prefill_attn``).
        dist: input distribution, one of :data:`DISTRIBUTIONS` (see :mod:`mla_fp8_bench.problem.inputs`).
        seed: generator seed; the same seed gives the same inputs on every run.

    Raises:
        CaseError: on empty batches, seq_len <= 0, num_heads <= 0, unknown quant/dist, or more than
            :data:`MAX_TOTAL_TOKENS` tokens.
    """

    seq_lens: tuple[int, ...]
    num_heads: int = DEFAULT_NUM_HEADS
    quant: str = "per_tensor"
    dist: str = "normal"
    seed: int = 0
    causal: bool = field(default=True, repr=False)

    def __post_init__(self) -> None:
        lens = tuple(self.seq_lens)
        object.__setattr__(self, "seq_lens", lens)
        if not lens:
            raise CaseError("empty batch: seq_lens must hold at least one sequence length")
        for s in lens:
            if not isinstance(s, int) or isinstance(s, bool) or s <= 0:
                raise CaseError(f"seq_len {s!r} is invalid: every seq_len must be an integer >= 1")
        if sum(lens) > MAX_TOTAL_TOKENS:
            raise CaseError(f"total tokens {sum(lens)} exceed the supported maximum {MAX_TOTAL_TOKENS}")
        if not isinstance(self.num_heads, int) or not 1 <= self.num_heads <= MAX_NUM_HEADS:
            raise CaseError(f"num_heads {self.num_heads!r} is invalid: allowed 1..{MAX_NUM_HEADS}")
        if self.quant not in QUANT_MODES:
            raise CaseError(f"quant mode {self.quant!r} is unknown: allowed {', '.join(QUANT_MODES)}")
        if self.dist not in DISTRIBUTIONS:
            raise CaseError(f"distribution {self.dist!r} is unknown: allowed {', '.join(DISTRIBUTIONS)}")
        if not isinstance(self.seed, int) or self.seed < 0:
            raise CaseError(f"seed {self.seed!r} is invalid: must be an integer >= 0")
        if self.causal is not True:
            raise CaseError("only causal prefill is supported (causal=True)")

    # ------------------------------------------------------------------ derived sizes
    @property
    def batch_size(self) -> int:
        """Number of sequences B."""
        return len(self.seq_lens)

    @property
    def total_tokens(self) -> int:
        """Total query tokens T = sum(seq_lens)."""
        return sum(self.seq_lens)

    @property
    def max_seq_len(self) -> int:
        """Longest sequence."""
        return max(self.seq_lens)

    def cu_seqlens(self) -> list[int]:
        """Cumulative sequence starts ``[0, s0, s0+s1, ...]`` (length B+1): qo_indptr == kv_indptr."""
        out = [0]
        for s in self.seq_lens:
            out.append(out[-1] + s)
        return out

    # ------------------------------------------------------------------ ids
    @property
    def id(self) -> str:
        """The stable short id (see module docstring)."""
        return format_case_id(self)

    def with_(self, **changes) -> Case:
        """A copy with fields replaced (validated)."""
        return replace(self, **changes)


def _format_lens(lens: tuple[int, ...]) -> str:
    parts: list[str] = []
    i = 0
    while i < len(lens):
        j = i
        while j + 1 < len(lens) and lens[j + 1] == lens[i]:
            j += 1
        n = j - i + 1
        parts.append(f"{lens[i]}x{n}" if n > 1 else str(lens[i]))
        i = j + 1
    return "-".join(parts)


def format_case_id(case: Case) -> str:
    """Build the id of ``case``; :func:`parse_case_id` inverts it."""
    base = f"s{case.seq_lens[0]}" if case.batch_size == 1 else "ragged-" + _format_lens(case.seq_lens)
    sfx = []
    if case.num_heads != DEFAULT_NUM_HEADS:
        sfx.append(f"h{case.num_heads}")
    if case.quant != "per_tensor":
        sfx.append(_QUANT_SUFFIX[case.quant])
    if case.dist != "normal":
        sfx.append(_DIST_SUFFIX[case.dist])
    if case.seed != 0:
        sfx.append(f"seed{case.seed}")
    return "-".join([base, *sfx])


_ID_HELP = (
    "expected 's<seq_len>' or 'ragged-<len>[x<count>]-...' followed by optional suffixes "
    "'-h<heads>', '-cast', '-outlier'|'-mla'|'-const', '-seed<n>' (e.g. s4096, s4096-h128, "
    "ragged-6992-6896-2495, ragged-4096x4-cast)"
)


def parse_case_id(case_id: str) -> Case:
    """Parse a case id (see module docstring) or a named-suite member.

    Raises:
        CaseError: naming the bad id and the accepted grammar.
    """
    if not isinstance(case_id, str) or not case_id:
        raise CaseError(f"case id {case_id!r} is invalid: {_ID_HELP}")
    tokens = case_id.split("-")
    lens: list[int] = []
    if re.fullmatch(r"s\d+", tokens[0]):
        lens = [int(tokens[0][1:])]
        rest = tokens[1:]
    elif tokens[0] == "ragged":
        rest = tokens[1:]
        while rest and re.fullmatch(r"\d+(x\d+)?", rest[0]):
            tok = rest.pop(0)
            if "x" in tok:
                n, c = tok.split("x")
                if int(c) < 1:
                    raise CaseError(f"case id {case_id!r}: repeat count in {tok!r} must be >= 1")
                lens += [int(n)] * int(c)
            else:
                lens.append(int(tok))
        if not lens:
            raise CaseError(f"case id {case_id!r} has no sequence lengths (empty batch): {_ID_HELP}")
    else:
        raise CaseError(f"case id {case_id!r} is invalid: {_ID_HELP}")
    kw: dict = {}
    for tok in rest:
        if re.fullmatch(r"h\d+", tok) and "num_heads" not in kw:
            kw["num_heads"] = int(tok[1:])
        elif tok == "cast" and "quant" not in kw:
            kw["quant"] = "cast"
        elif tok in ("outlier", "mla", "const") and "dist" not in kw:
            kw["dist"] = tok
        elif re.fullmatch(r"seed\d+", tok) and "seed" not in kw:
            kw["seed"] = int(tok[4:])
        else:
            raise CaseError(f"case id {case_id!r}: suffix {tok!r} is not recognised: {_ID_HELP}")
    case = Case(tuple(lens), **kw)
    if case.id != case_id:
        raise CaseError(f"case id {case_id!r} is not canonical: write it as {case.id!r}")
    return case


# ---------------------------------------------------------------------- named suites
#: The default seq_len sweep (issue #2). Devices cap it: see :func:`default_sweep`.
SWEEP_SEQ_LENS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
#: Largest seq_len of the default sweep per device kind. The CPU cap keeps a full asv run within
#: minutes on a 2-core machine (the float64 reference and the emulator are O(S^2)).
SWEEP_CAPS = {"cpu": 2048, "cuda": 32768}

SUITES: dict[str, tuple[str, ...]] = {
    "sweep": tuple(f"s{s}" for s in SWEEP_SEQ_LENS),
    "tile-edges": ("s255", "s256", "s257", "s511", "s512", "s513"),
    "ragged": ("ragged-6992-6896-2495", "ragged-4096x4", "s8175"),
    "aiter-odd": ("s21", "s1200", "s3200", "s5200", "s10000"),
    "edge": (
        "s1",
        "s255",
        "s256",
        "s257",
        "ragged-1x120-8000",
        "ragged-16384x4-4096",
        "s512-h1",
        "s512-h8",
        "s512-h12",
        "s512-h24",
        "s512-h32",
        "s512-h64",
        "s512-h128",
        "s512-cast-outlier",
        "s512-const",
    ),
    "short-prompt": ("ragged-603-640-655-698",),
}


def default_sweep(device_type: str, cap: int | None = None) -> tuple[tuple[str, ...], str]:
    """The default seq_len sweep for a device type, capped.

    Args:
        device_type: ``"cpu"`` or ``"cuda"`` (ROCm devices are ``"cuda"`` in PyTorch).
        cap: overrides the per-device cap (tokens).

    Returns:
        (case ids, a sentence saying where the sweep stops and why).

    Raises:
        CaseError: on an unknown device type.
    """
    if device_type not in SWEEP_CAPS:
        raise CaseError(f"device type {device_type!r} is unknown: allowed {', '.join(SWEEP_CAPS)}")
    limit = SWEEP_CAPS[device_type] if cap is None else cap
    ids = tuple(f"s{s}" for s in SWEEP_SEQ_LENS if s <= limit)
    note = (
        f"default sweep on {device_type} stops at seq_len {limit}"
        + (" (the float64 reference and the CPU emulator are O(seq_len^2))" if device_type == "cpu" else "")
    )
    return ids, note


def resolve_cases(specs: list[str] | tuple[str, ...]) -> list[Case]:
    """Expand suite names (``sweep``, ``ragged``, ...) and case ids into cases, de-duplicated in order.

    Raises:
        CaseError: for an unknown id or suite name (lists the suites).
    """
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
