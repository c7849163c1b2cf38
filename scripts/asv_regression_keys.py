"""Rewrite the regression keys of asv configs from the metric table:
``python scripts/asv_regression_keys.py asv*.conf.json`` (``tests/test_metric_table.py`` checks they agree)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# ruff: noqa: E402
from mla_fp8_bench.harness.asv_support import emulation_backends
from mla_fp8_bench.jsonio import write_file_atomic
from mla_fp8_bench.measure.metric_table import Metric, asv_metrics

#: Steps in the suite's own history (``asv.conf.json``, keyed by this suite's commits) that a change of an
#: emulation's semantics left, not a change of the code measured: (track, backend) -> the commit from
#: which asv looks for regressions. At 1bc13b1 the emulated PS plan gave every tile a partial slot, as
#: AITER's ``need_lse`` change did before it shipped.
SUITE_FIRST_COMMITS = {(track, "aiter-emulated"): "1bc13b171e28c9d31ee2b863ffc03b541a0ce44f"
                       for track in ("track_num_partials", "track_workspace_bytes")}


def _asv_regex(m: Metric, backend: str | None = None) -> str:
    return "^" + re.escape(m.asv_name) + (re.escape(f"('{backend}'") if backend else r"(\(|$)")


def asv_regression_config(suite: bool = False) -> dict[str, dict[str, Any]]:
    """asv's ``regressions_thresholds`` (one anchored, disjoint regex per track: asv applies the maximum over
    matches) and ``regressions_first_commits`` (None: never reported) from the table; with ``suite`` (this
    suite's own history) :data:`SUITE_FIRST_COMMITS` too."""
    thresholds: dict[str, float] = {}
    first: dict[str, str | None] = {}
    for m in asv_metrics():
        if m.regression_factor is not None:
            thresholds[_asv_regex(m)] = round(m.regression_factor - 1.0, 12)
        else:
            first[_asv_regex(m)] = None
        if m.kind == "kernel_latency":
            first.update({_asv_regex(m, b): None for b in emulation_backends()})
        if suite:
            first.update({_asv_regex(m, b): sha for (t, b), sha in SUITE_FIRST_COMMITS.items() if t == m.track})
    return {"regressions_thresholds": thresholds, "regressions_first_commits": first}


_BLOCK_COMMENT = """\
    // Generated from mla_fp8_bench/measure/metric_table.py (python scripts/asv_regression_keys.py
    // <this file>); tests/test_metric_table.py checks it. One anchored regex per track (asv applies
    // the MAX over matching entries, so they are disjoint): the gate's default rule, growth factor minus 1
    // (accuracy 1.0: 2x, kernel latency and resources 0.05). regressions_first_commits null: no regression
    // is reported for figures that are not a kernel's (host latency, informational, an emulation's latency);
    // a commit: regressions are looked for from it on (an emulation's semantics changed there).
"""


def write_asv_config(path: str) -> bool:
    """Replace the regression keys, the last entries of an asv config file, with the generated ones; whether
    the file changed."""
    text = open(path).read()
    at = re.search(r'^(\s*//.*\n)*\s*"regressions_', text, re.M)
    if at is None:
        raise ValueError(f"{path}: no \"regressions_thresholds\" key to replace")
    head = text[:at.start()].rstrip()
    keys = asv_regression_config(suite=re.search(r'^\s*"repo"\s*:\s*"\."', head, re.M) is not None)
    new = (head if head.endswith((",", "{")) else head + ",") + "\n" + _BLOCK_COMMENT + json.dumps(
        keys, indent=4).strip()[1:-1].strip("\n") + "\n}\n"
    if new != text:
        write_file_atomic(path, lambda f: f.write(new))
    return new != text


if __name__ == "__main__":
    for conf in sys.argv[1:]:
        print(f"{conf}: {'updated' if write_asv_config(conf) else 'already current'}")
