"""The gate's reports: a text table for a terminal and a CI log (one line per row, never wrapped), or
markdown for a PR comment."""

from __future__ import annotations

from mla_fp8_bench.analysis.gate.judge import Row, counts, failing

COLUMNS = ("verdict", "backend", "case", "metric", "BASE", "HEAD", "ratio", "detail")
#: Verdicts listed only with ``--all`` (counted always).
QUIET = ("ok", "info", "new")
#: Rows of a markdown table: a GitHub comment holds at most 65,536 characters.
MD_MAX_ROWS = 50


def _cells(r: Row) -> tuple[str, ...]:
    return tuple(" ".join(str(x).split()) for x in (r.verdict, r.backend, r.case, r.metric, r.base, r.head,
                                                    r.ratio, r.detail))


def table(rows: list[Row]) -> list[str]:  # a header and one line per row, columns padded to their widest cell
    cells = [COLUMNS, *map(_cells, rows)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS) - 1)]
    return ["  ".join([*(x.ljust(w) for x, w in zip(c, widths)), c[-1]]).rstrip() for c in cells]


def verdict_line(rows: list[Row], word: str, allow_missing: bool = False) -> str:
    bad, judged = failing(rows, allow_missing), sum(r.judged for r in rows)
    if nothing := [r for r in bad if r.verdict == "NOTHING COMPARED"]:
        return f"{word} FAILED: nothing judged: {nothing[0].detail}"
    return f"{word} {'FAILED: ' + counts(bad) + ';' if bad else 'PASSED:'} {judged} value(s) judged"


def _summary(rows: list[Row]) -> list[str]:
    info = [r for r in rows if r.verdict == "info"]
    why = "; ".join(sorted({r.detail.split(":")[0] for r in info}))
    return [f"informational, never gating: {len(info)} latency row(s) ({why})"] * bool(info) + [
        f"rows by verdict: {counts(rows)}"]


def show(console, rows: list[Row], title: str, settings: str, *, word: str = "GATE", fmt: str = "text",
         allow_missing: bool = False, show_all: bool = False) -> bool:
    """Print the text or markdown report (the notable rows; every row with ``show_all``); True when the
    verdict failed."""
    failed = bool(failing(rows, allow_missing))
    if fmt == "markdown":
        md = markdown(rows, title, settings, word=word.lower(), allow_missing=allow_missing)
        console.print(md.rstrip(), markup=False, highlight=False, soft_wrap=True)
        return failed
    shown = rows if show_all else [r for r in rows if r.verdict not in QUIET]
    lines = [title, settings, *(table(shown) if shown else []), *_summary(rows)]
    console.print("\n".join(lines), markup=False, highlight=False, soft_wrap=True)
    console.print(verdict_line(rows, word, allow_missing), style="bold red" if failed else "green", markup=False,
                  highlight=False, soft_wrap=True)
    return failed


def markdown(rows: list[Row], title: str, settings: str, *, word: str = "gate", allow_missing: bool = False) -> str:
    """A PR comment: the verdict, what was compared and how, the notable rows (at most :data:`MD_MAX_ROWS`)."""
    shown = [r for r in rows if r.verdict not in QUIET]
    out = [f"## mla-fp8-bench {word}", "", f"**{verdict_line(rows, word.upper(), allow_missing)}**", "",
           f"{title}; {settings}", ""]
    if shown:
        out += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        out += ["| " + " | ".join(x.replace("|", "\\|") for x in _cells(r)) + " |" for r in shown[:MD_MAX_ROWS]]
        out += [f"\n... and {len(shown) - MD_MAX_ROWS} more (the text report lists every row)"] * (
            len(shown) > MD_MAX_ROWS) + [""]
    return "\n".join(out + [x[0].upper() + x[1:] for x in _summary(rows)]) + "\n"
