"""``mla-fp8-bench plan``: JSON equal to AITER's golden records, sizes, and bad input (exit 2, one line)."""

from __future__ import annotations

import functools
import gzip
import json
import re
from pathlib import Path

import pytest

from mla_fp8_bench.cli import main

DATA = Path(__file__).resolve().parent / "data"
GOLDEN = {"0.1.20": "ps_planner_golden_v2_pre3606.json.gz", "0.1.22": "ps_planner_golden_v2_post3606.json.gz"}
MAX_ROWS = 20_000  # records whose work_info bound is larger are left to tests/test_planner.py


@functools.cache
def _records(version: str) -> list[dict]:
    with gzip.open(DATA / GOLDEN[version], "rt") as f:
        return json.load(f)["records"]


def _picked() -> list:
    """Per revision, the first record of every (family, group, causal) kind that is small enough."""
    out = []
    for version in GOLDEN:
        seen = set()
        for i, rec in enumerate(_records(version)):
            c = rec["config"]
            kind = (c["family"], c["group"], c["is_causal"])
            if kind not in seen and rec["info_shapes"]["work_info"]["shape"][0] <= MAX_ROWS:
                seen.add(kind)
                out.append(pytest.param(version, i, id=f"{version}-{c['id']}-{c['name']}"))
    return out


def _argv(cfg: dict, version: str, json_path: Path) -> list[str]:
    argv = ["plan", "--qo-lens", ",".join(map(str, cfg["seq_lens_q"])),
            "--kv-lens", ",".join(map(str, cfg["seq_lens_kv"])), "--heads", str(cfg["num_heads_k"]),
            "--cu-num", str(cfg["cu_num"]), "--aiter", version, "--json", str(json_path), "--limit", "2"]
    return argv + ([] if cfg["is_causal"] else ["--non-causal"])


@pytest.mark.parametrize("version, idx", _picked())
def test_plan_json_equals_golden_record(version, idx, tmp_path, capsys):
    rec = _records(version)[idx]
    out = tmp_path / "plan.json"
    assert main(_argv(rec["config"], version, out)) == 0
    got = json.loads(out.read_text())
    assert got["info_shapes"] == rec["info_shapes"]
    assert got["outputs"] == rec["outputs"]
    assert got["info_args"] == rec["info_args"]
    if version == "0.1.22":
        assert got["info_shapes_max_kvlen_none"] == rec["info_shapes_max_kvlen_none"]
    else:
        assert "info_shapes_max_kvlen_none" not in got
    for key in ("seqlens_qo_indptr", "pages_kv_indptr", "context_lens", "num_heads_k", "cu_num", "is_causal"):
        assert got["config"][key] == rec["config"][key]
    assert f"AITER {version}" in capsys.readouterr().out


def _slot_line(text: str, label: str) -> tuple[int, int]:
    m = re.search(re.escape(label) + r"\s+([\d,]+) slots\s+([\d,]+) B", text)
    assert m, f"no line {label!r} in:\n{text}"
    return int(m.group(1).replace(",", "")), int(m.group(2).replace(",", ""))


def _fp32_bytes(slots: int, tokens: int, heads: int) -> int:
    return 4 * (slots * 256 * heads * 128 + slots * 256 * heads + tokens * heads)


@pytest.mark.parametrize("version, bound", [("0.1.20", 1920), ("0.1.22", 147456)])
def test_plan_bounds_b16_s16384(version, bound, capsys):
    """B=16 x 16384, H=16, cu 256: 1,920 partial slots before #3606 and 147,456 after (AITER's info
    function at both revisions), i.e. ~4 GB and ~312 GB of fp32 partials + LSE if reserved."""
    lens = ",".join(["16384"] * 16)
    assert main(["plan", "--qo-lens", lens, "--kv-lens", lens, "--heads", "16", "--aiter", version,
                 "--limit", "0"]) == 0
    text = capsys.readouterr().out
    label = "reserved: info bound (max_kvlen = largest kv_len)" if version == "0.1.22" else "reserved: info bound"
    slots, nbytes = _slot_line(text, label)
    assert slots == bound and nbytes == _fp32_bytes(bound, 16 * 16384, 16)
    used, used_bytes = _slot_line(text, "used (live reduce_indptr[-1])")
    assert used == (0 if version == "0.1.20" else 16 * 64)  # 64 tiles per sequence, all reduced post-#3606
    assert used_bytes == _fp32_bytes(used, 16 * 16384, 16)


def test_plan_readme_example(capsys):
    assert main(["plan", "--qo-lens", "256,300", "--kv-lens", "4352,1300", "--heads", "16", "--cu-num", "256",
                 "--aiter", "0.1.22"]) == 0
    text = capsys.readouterr().out
    # post-#3606 info: tiles = 2 * ceil(300/256) = 4, cpc = 256/16 = 16; kv_splits ceil(4352/128) = 34
    # (max_kvlen = 4352) or ceil(300/128) = 3 (max_kvlen=None): 4*(34+16) = 200 and 4*(3+16) = 76 slots
    assert _slot_line(text, "reserved: info bound (max_kvlen = largest kv_len)")[0] == 200
    assert _slot_line(text, "reserved: info bound (max_kvlen=None)")[0] == 76
    # vLLM >= 0.31: ceil(556/256) + 2 - 1 + 256 = 260 slots, each buffer rounded up to 256 bytes
    slots, nbytes = _slot_line(text, "reserved: vLLM >= 0.31 builder (budget), H=16")
    assert slots == 260 and nbytes == _fp32_bytes(260, 556, 16)
    assert "reduce groups: 3 of 3 q-tiles" in text  # post-#3606: every tile has a group


BAD = {
    "mismatched": (["--qo-lens", "256,300", "--kv-lens", "4352"], r"--qo-lens has 2 sequences but --kv-lens has 1"),
    "q-gt-kv": (["--qo-lens", "300", "--kv-lens", "200"], r"q_len=300 > kv_len=200"),
    "negative": (["--qo-lens", "-5", "--kv-lens", "200"], r"--qo-lens\[0\]=-5 is out of range"),
    "non-integer": (["--qo-lens", "2.5", "--kv-lens", "200"], r"--qo-lens\[0\]='2.5' is not an integer"),
    "empty-item": (["--qo-lens", "256,", "--kv-lens", "300,300"], r"--qo-lens='256,' is not a comma-separated"),
    "heads-zero": (["--heads", "0"], r"--heads=0 is out of range: allowed 1\.\.65535"),
    "cu-zero": (["--cu-num", "0"], r"--cu-num=0 is out of range"),
    "cu-text": (["--cu-num", "many"], r"--cu-num='many' is not an integer"),
    "absurd-len": (["--qo-lens", "3000000000", "--kv-lens", "3000000000"], r"is out of range: allowed 0\.\.2147483647"),
    "absurd-total": (["--qo-lens", ",".join(["2000000000"] * 2), "--kv-lens", ",".join(["2000000000"] * 2)],
                     r"total kv tokens 4000000000 do not fit int32"),
    "absurd-works": (["--qo-lens", "100000000", "--kv-lens", "100000000", "--heads", "128"],
                     r"too large to plan here"),
    "bad-version": (["--aiter", "latest"], r"AITER version 'latest' is not MAJOR\.MINOR\.PATCH"),
    "old-version": (["--aiter", "0.1.7"], r"AITER 0\.1\.7 has no PS prefill planner"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_plan_bad_input(name, capsys):
    change, pattern = BAD[name]
    argv = dict(zip(["--qo-lens", "--kv-lens", "--heads"], ["256", "300", "16"]))
    extra = []
    for k, v in zip(change[::2], change[1::2]):
        if k in argv:
            argv[k] = v
        else:
            extra += [k, v]
    args = ["plan"] + [x for kv in argv.items() for x in kv] + extra
    assert main(args) == 2
    out = capsys.readouterr().out.strip()
    assert len(out.splitlines()) == 1 and out.startswith("error:"), out
    assert re.search(pattern, out), out


def test_plan_unwritable_json(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for target in (tmp_path, blocker / "plan.json"):
        assert main(["plan", "--qo-lens", "256", "--kv-lens", "300", "--heads", "16", "--json", str(target)]) == 2
        out = capsys.readouterr().out.strip()
        assert len(out.splitlines()) == 1 and "--json" in out and "works:" not in out, out
