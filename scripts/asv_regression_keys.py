"""Rewrite the regression keys of asv configs from the metric table:
``python scripts/asv_regression_keys.py asv*.conf.json`` (``tests/test_metric_table.py`` checks they agree)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# ruff: noqa: E402
from mla_fp8_bench.harness.asv_tracks import asv_regression_config
from mla_fp8_bench.jsonio import write_file_atomic

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
