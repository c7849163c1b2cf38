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
#: (--aiter, --need-lse) -> AITER's planner outputs at that release and flag (tests/data/README.md)
GOLDEN = {("0.1.20", None): "ps_planner_golden_v2_pre3606.json.gz",
          ("0.1.22", "0"): "ps_planner_golden_v3_final3606_nolse.json.gz",
          ("0.1.22", "1"): "ps_planner_golden_v3_final3606_lse.json.gz"}
MAX_ROWS = 20_000  # records whose work_info bound is larger are left to tests/test_planner.py


@functools.cache
def _records(key: tuple) -> list[dict]:
    with gzip.open(DATA / GOLDEN[key], "rt") as f:
        return json.load(f)["records"]


def _picked() -> list:
    """Per revision, the first record of every (family, group, causal) kind that is small enough."""
    out = []
    for key in GOLDEN:
        seen = set()
        for i, rec in enumerate(_records(key)):
            c = rec["config"]
            kind = (c["family"], c["group"], c["is_causal"])
            if kind not in seen and rec["info_shapes"]["work_info"]["shape"][0] <= MAX_ROWS:
                seen.add(kind)
                out.append(pytest.param(key, i, id=f"{key[0]}-lse{key[1]}-{c['id']}-{c['name']}"))
    return out


def _argv(cfg: dict, key: tuple, json_path: Path) -> list[str]:
    version, need_lse = key
    argv = ["plan", "--qo-lens", ",".join(map(str, cfg["seq_lens_q"])),
            "--kv-lens", ",".join(map(str, cfg["seq_lens_kv"])), "--heads", str(cfg["num_heads_k"]),
            "--cu-num", str(cfg["cu_num"]), "--aiter", version, "--json", str(json_path), "--limit", "2"]
    argv += [] if need_lse is None else ["--need-lse", need_lse]
    return argv + ([] if cfg["is_causal"] else ["--non-causal"])


@pytest.mark.parametrize("key, idx", _picked())
def test_plan_json_equals_golden_record(key, idx, tmp_path, capsys):
    rec = _records(key)[idx]
    out = tmp_path / "plan.json"
    assert main(_argv(rec["config"], key, out)) == 0
    got = json.loads(out.read_text())
    assert got["info_shapes"] == rec["info_shapes"]
    assert got["outputs"] == rec["outputs"]
    assert {k: got["info_args"][k] for k in rec["info_args"]} == rec["info_args"]
    assert got["config"].get("need_lse") == rec["config"].get("need_lse")
    for k in ("seqlens_qo_indptr", "pages_kv_indptr", "context_lens", "num_heads_k", "cu_num", "is_causal"):
        assert got["config"][k] == rec["config"][k]
    assert f"AITER {key[0]}" in capsys.readouterr().out


def test_plan_need_lse_defaults_to_the_callers_convention(tmp_path):
    """Causal prefill: need_lse=False (vLLM's path); a non-causal context chunk: True."""
    for extra, want in (([], False), (["--non-causal"], True)):
        out = tmp_path / "p.json"
        assert main(["plan", "--qo-lens", "300", "--kv-lens", "300", "--heads", "16", "--json", str(out)] + extra) == 0
        assert json.loads(out.read_text())["config"]["need_lse"] is want


def _slot_line(text: str, label: str) -> tuple[int, int]:
    m = re.search(re.escape(label) + r"\s+([\d,]+) slots\s+([\d,]+) B", text)
    assert m, f"no line {label!r} in:\n{text}"
    return int(m.group(1).replace(",", "")), int(m.group(2).replace(",", ""))


def _fp32_bytes(slots: int, tokens: int, heads: int) -> int:
    return 4 * (slots * 256 * heads * 128 + slots * 256 * heads + tokens * heads)


@pytest.mark.parametrize("version, bound", [("0.1.20", 1920), ("0.1.22", 1039)])
def test_plan_bounds_b16_s16384(version, bound, capsys):
    """B=16 x 16384, H=16, cu 256: 1,920 partial slots before #3606 (min(16 + 15, 30) * 64) and 1,039 at
    v0.1.22 (16 * 64 + 15); a causal prefill plans with need_lse=False and splits nothing there."""
    lens = ",".join(["16384"] * 16)
    assert main(["plan", "--qo-lens", lens, "--kv-lens", lens, "--heads", "16", "--aiter", version,
                 "--limit", "0"]) == 0
    text = capsys.readouterr().out
    slots, nbytes = _slot_line(text, "reserved: info bound")
    assert slots == bound and nbytes == _fp32_bytes(bound, 16 * 16384, 16)
    used, used_bytes = _slot_line(text, "used (live reduce_indptr[-1] = 0, >= 1)")
    assert used == 1 and used_bytes == _fp32_bytes(1, 16 * 16384, 16)  # a call allocates one slot at least


@pytest.mark.parametrize("need_lse, live, used_bytes", [("0", 0, 3_162_112), ("1", 64, 136_314_880)])
def test_plan_s16384_live_vs_reserved(need_lse, live, used_bytes, capsys):
    """s16384 H16 cu256 at v0.1.22: live 0 (need_lse=False) or 64 (True: every tile reduced) slots of 79. Used
    bytes, by hand: max(1, live) slots x 256 rows x 16 heads x (128 + 1) x 4 B + 16384 rows x 16 heads x 4 B;
    3,162,112 B is what the ``workspace_bytes`` track records for s16384 (the same definition)."""
    assert main(["plan", "--qo-lens", "16384", "--kv-lens", "16384", "--heads", "16", "--need-lse", need_lse,
                 "--limit", "0"]) == 0
    text = capsys.readouterr().out
    assert _slot_line(text, f"used (live reduce_indptr[-1] = {live}, >= 1)") == (max(1, live), used_bytes)
    assert _slot_line(text, "reserved: info bound")[0] == 79
    assert "info sizing: no total_qlen budget" in text


def test_plan_total_qlen_budget_sizes_the_info_bound(tmp_path, capsys):
    """One 16384-token request and 255 single tokens (B=256, H16, cu 256), budget 16639 = the batch's tokens:
    unbudgeted 256 * 64 + 15 = 16399 slots; the model gives the largest partial map the pinned bound allows,
    (16639 + 256 * (256 + 256)) // 256 = 64 + 512 = 576 slots; reduce_final_map keeps 256 * 64 rows; the plan fits
    (live: 64 tiles + 255 tiles, need_lse, within 576). At a budget the batch exceeds, one line says so."""
    lens, out = ",".join(["16384"] + ["1"] * 255), tmp_path / "p.json"
    argv = ["plan", "--qo-lens", lens, "--kv-lens", lens, "--heads", "16", "--need-lse", "1", "--limit", "0"]
    assert main(argv + ["--total-qlen", "16639", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert _slot_line(text, "reserved: info bound") == (576, _fp32_bytes(576, 16639, 16))
    assert "info sizing: total_qlen=16639 budget" in text and "total-qlen planner" in text
    rec = json.loads(out.read_text())
    assert rec["info_args"]["total_qlen"] == 16639 and rec["config"]["planner_revision"] == "total-qlen"
    assert rec["info_shapes"]["reduce_final_map"]["shape"] == [256 * 64, 2]
    assert 64 + 255 <= rec["outputs"]["num_partials"] <= 576
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert _slot_line(text, "reserved: info bound")[0] == 16399 and "info sizing: no total_qlen budget" in text
    assert main(argv + ["--total-qlen", "16638"]) == 2
    assert "the batch has 16639 new tokens but --total-qlen=16638" in capsys.readouterr().out


def test_plan_readme_example(capsys):
    assert main(["plan", "--qo-lens", "256,300", "--kv-lens", "4352,1300", "--heads", "16", "--cu-num", "256",
                 "--aiter", "0.1.22", "--non-causal"]) == 0
    text = capsys.readouterr().out
    # v0.1.22 info: tiles = 2 * ceil(300/256) = 4, cpc = 256/16 = 16: 4 + 15 = 19 slots
    assert _slot_line(text, "reserved: info bound")[0] == 19
    # vLLM >= 0.31: ceil(556/256) + 2 - 1 + 256 = 260 slots, each buffer rounded up to 256 bytes
    slots, nbytes = _slot_line(text, "reserved: vLLM >= 0.31 builder (budget), H=16")
    assert slots == 260 and nbytes == _fp32_bytes(260, 556, 16)
    assert "need_lse=True" in text and "reduce groups: 3 of 3 q-tiles" in text  # every tile has a group


#: The allowed form every --qo-lens item message names.
LIST_FORM = r"--qo-lens takes a comma-separated list of integers >= 0 written in ASCII digits 0-9, e.g\. 512,1024"
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
    "bad-version": (["--aiter", "latest"], r"--aiter='latest' is invalid: an AITER version MAJOR\.MINOR\.PATCH"),
    "old-version": (["--aiter", "0.1.7"], r"--aiter='0\.1\.7' is invalid: .* from 0\.1\.10 to 0\.1\.22"),
    "future-version": (["--aiter", "9.9.9"], r"--aiter='9\.9\.9' is invalid: .* from 0\.1\.10 to 0\.1\.22"),
    "need-lse-text": (["--need-lse", "yes"], r"--need-lse='yes' is invalid: allowed 0 or 1"),
    "need-lse-old": (["--aiter", "0.1.20", "--need-lse", "1"], r"AITER 0\.1\.20 has no need_lse"),
    "total-qlen-old": (["--aiter", "0.1.20", "--total-qlen", "100"], r"AITER 0\.1\.20 has no total_qlen"),
    "total-qlen-zero": (["--total-qlen", "0"], r"--total-qlen=0 is out of range: allowed 1\."),
    # integers are ASCII digits only: int() would misread these
    "double-plus": (["--qo-lens", "++5"], r"--qo-lens\[0\]='\+\+5' is not an integer: " + LIST_FORM),
    "plus": (["--qo-lens", "+5"], r"--qo-lens\[0\]='\+5' is not an integer: " + LIST_FORM),
    "superscript": (["--qo-lens", "256,\u00b2"], r"--qo-lens\[1\]='\u00b2' is not an integer: " + LIST_FORM),
    "arabic-indic": (["--qo-lens", "\u0665"], r"--qo-lens\[0\]='\u0665' is not an integer: " + LIST_FORM),
    "underscore": (["--qo-lens", "1_000"], r"--qo-lens\[0\]='1_000' is not an integer: " + LIST_FORM),
    "trailing-text": (["--qo-lens", "5x"], r"--qo-lens\[0\]='5x' is not an integer: " + LIST_FORM),
    "inner-empty": (["--qo-lens", "5,,6"], r"--qo-lens='5,,6' is not a comma-separated list of integers: "
                                            r"--qo-lens\[1\] is empty; " + LIST_FORM),
    "all-empty": (["--qo-lens", ""], r"--qo-lens='' is not a comma-separated list of integers: it is empty; "
                                      + LIST_FORM),
    "kv-arabic-indic": (["--kv-lens", "\u0665\u0660\u0660"],
                        r"--kv-lens\[0\]='\u0665\u0660\u0660' is not an integer: --kv-lens takes a comma-separated"),
    "heads-arabic-indic": (["--heads", "\u0661\u0666"],
                           r"--heads='\u0661\u0666' is not an integer: allowed 1\.\.65535, written in ASCII digits"),
    "vllm-seqs-empty": (["--vllm-max-num-seqs", ""], r"--vllm-max-num-seqs='' is not an integer: allowed 1\.\.65536"),
    "vllm-tokens-empty": (["--vllm-max-num-batched-tokens", ""],
                          r"--vllm-max-num-batched-tokens='' is not an integer: allowed 1\.\.2147483647"),
    "vllm-model-len-empty": (["--vllm-max-model-len", ""], r"--vllm-max-model-len='' is not an integer: allowed 1\."),
    "vllm-seqs-arabic-indic": (["--vllm-max-num-seqs", "\u0665"], r"--vllm-max-num-seqs='\u0665' is not an integer"),
    # the message names the value given, not one derived from it
    "zero-lens-tokens-below-b": (["--qo-lens", "0,0", "--kv-lens", "300,300", "--vllm-max-num-batched-tokens", "1"],
                                 r"--vllm-max-num-batched-tokens=1 < max_num_seqs=2 \(B, the default of "
                                 r"--vllm-max-num-seqs\): vLLM refuses it .*allowed >= 2"),
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


@pytest.mark.parametrize("qo,kv", [("512,1024", "512,1024"), (" 512 , 1024 ", "512, 1024\t"),
                                   ("0512,1024", "512,01024")])
def test_plan_reads_ascii_integer_lists(qo, kv, tmp_path):
    out = tmp_path / "plan.json"
    assert main(["plan", "--qo-lens", qo, "--kv-lens", kv, "--heads", " 16 ", "--limit", "0", "--json", str(out)]) == 0
    config = json.loads(out.read_text())["config"]
    assert (config["seq_lens_q"], config["seq_lens_kv"], config["num_heads_k"]) == ([512, 1024], [512, 1024], 16)


def test_plan_zero_length_sequences_are_planned(tmp_path, capsys):
    """qo_indptr with equal neighbours is a valid planner input (no q-tiles for that sequence), also for every
    sequence; vLLM's default builder inputs are then the smallest it accepts (tokens >= max_num_seqs = B)."""
    out = tmp_path / "plan.json"
    assert main(["plan", "--qo-lens", "0,0", "--kv-lens", "300,300", "--heads", "16", "--json", str(out)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "works: 0" in text and "max_num_seqs=2, max_num_batched_tokens=2, max_model_len=300" in text
    assert json.loads(out.read_text())["outputs"]["num_works"] == 0
    assert main(["plan", "--qo-lens", "0,300,0", "--kv-lens", "300,300,300", "--heads", "16", "--limit", "0",
                 "--vllm-max-num-seqs", "8"]) == 0
    assert "max_num_seqs=8, max_num_batched_tokens=300," in " ".join(capsys.readouterr().out.split())


def test_plan_unwritable_json(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for target in (tmp_path, blocker / "plan.json"):
        assert main(["plan", "--qo-lens", "256", "--kv-lens", "300", "--heads", "16", "--json", str(target)]) == 2
        out = capsys.readouterr().out.strip()
        assert len(out.splitlines()) == 1 and "--json" in out and "works:" not in out, out
