"""History keyed by the library under test, end to end on a CPU, offline: a fake AITER git history, the
SHIPPED ``asv.aiter.conf.json`` (byte for byte) and the SHIPPED benchmark classes (``benchmarks/``).

The fake library is a package named ``aiter`` (distribution ``amd-aiter``) exposing AITER's four PS
prefill primitives over the suite's stand-in (:func:`mla_fp8_bench.aiter_ps.standin.make_standin_aiter`,
planner port + emulator). Four commits; commit 2 injects ``drop_v_descale`` (an accuracy fault: the
output loses the v descale, a >10x larger max-abs error), commit 3 a ``time.sleep(SLEEP_S)`` in the
kernel call (a latency fault far above any load noise of an emulated s128 call, ~8 ms idle).

The shipped ``aiter`` backend drives it because ``MLA_FP8_BENCH_AITER_ANY_DEVICE=1`` (records labelled
emulation). The layout is the one the config documents: the suite's folder (the config, ``benchmarks``)
with the AITER checkout beside it (``"repo": "../aiter"``); ``-E virtualenv:<this python>`` overrides the
config's pinned Python. asv-managed environments see torch and this suite through a ``sitecustomize`` on
``ASV_PYTHONPATH`` (asv passes it as PYTHONPATH to every command in the environment); they install
``wheel`` and ``asv_runner`` from a local wheelhouse only (``PIP_NO_INDEX``; ``.ci/run`` fills it), so
the test never reaches the network and skips, saying how to fill it, when the wheelhouse is missing.

Assertions are on commits named and on values with margins that load cannot flip, never on wall time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# asv find A..B leaves A out and cannot see a step at its lowest commit (A's child): c0, c1 good; c2, c3 faulty
ACC_FAULT, LAT_FAULT, N_COMMITS = 2, 3, 4
# an emulated s128 call takes ~8 ms on an idle 2-core CPU; at load average 7.8 it took 40-60 ms with
# OMP_NUM_THREADS=1 (set below) and up to 0.75 s with 2 threads: the line at SLEEP_S / 2 = 1 s is > 15x
# above the loaded single-thread calls.
SLEEP_S = 2.0
CASE = "s128"
ACC_BENCH = rf"MLAPrefill\.track_max_abs_error\('aiter', '{CASE}'\)"
LAT_BENCH = rf"MLAPrefill\.track_latency\('aiter', '{CASE}'\)"
# healthy FP8 max-abs error vs the fp8-dequant reference is ~0.05; without the v descale it is > 1
ACC_THRESHOLD = 0.5

INIT = '''"""A fake AITER (test library): the four PS prefill primitives over mla_fp8_bench's stand-in."""
import time as _time

import sys as _sys

from aiter._settings import FAULTS, SLEEP_S, TESTS_DIR

_sys.path.insert(0, TESTS_DIR)  # the fault tables live with the tests (tests/support)
from mla_fp8_bench.aiter_ps.standin import make_standin_aiter as _make  # noqa: E402
from support.emulator_faults import FaultyEmulator as _Faulty  # noqa: E402

__version__ = "0.1.20"
_m = _make(emulator=_Faulty(FAULTS), cu_num=256, aiter_version=(0, 1, 20))
get_ps_metadata_info_v1 = _m.get_ps_metadata_info_v1
get_ps_metadata_v1 = _m.get_ps_metadata_v1
mla_reduce_v1 = _m.mla_reduce_v1
aiter_op_namespace = _m.aiter_op_namespace  # where the stand-in registered the op schemas


def mla_prefill_ps_asm_fwd(*args, **kwargs):
    if SLEEP_S:
        _time.sleep(SLEEP_S)
    return _m.mla_prefill_ps_asm_fwd(*args, **kwargs)
'''


def _git(cwd, *args):
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def make_fake_aiter(root: Path) -> tuple[Path, list[str]]:
    """The fake AITER repository ``root/aiter`` (branch main); returns (path, SHAs oldest first)."""
    lib = root / "aiter"
    (lib / "aiter").mkdir(parents=True)
    _git(root, "init", "-q", "-b", "main", str(lib))
    (lib / "pyproject.toml").write_text(textwrap.dedent('''\
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "amd-aiter"
        version = "0.1.20"
        [tool.setuptools]
        packages = ["aiter"]
        '''))
    (lib / "aiter" / "__init__.py").write_text(INIT)
    faults, sleep, shas = (), 0.0, []
    for i in range(N_COMMITS):
        msg = f"docs: note {i}"
        if i == ACC_FAULT:
            faults, msg = ("drop_v_descale",), "epilogue: simplify the output scaling"
        elif i == LAT_FAULT:
            sleep, msg = SLEEP_S, "kernel: add a launch-time debug check"
        (lib / "aiter" / "_settings.py").write_text(f"FAULTS = {faults!r}\nSLEEP_S = {sleep!r}\n"
                                                    f"TESTS_DIR = {str(ROOT / 'tests')!r}\n")
        (lib / "NOTES.md").write_text("".join(f"note {j}\n" for j in range(i + 1)))
        _git(lib, "add", "-A")
        # distinct, increasing commit dates: asv orders history and picks "previous" by date
        date = f"2026-01-0{i + 1}T00:00:00"
        subprocess.run(["git", "-C", str(lib), "commit", "-q", "-m", msg], check=True, capture_output=True,
                       env=dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
                                GIT_COMMITTER_EMAIL="t@t", GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date))
        shas.append(_git(lib, "rev-parse", "HEAD"))
    return lib, shas


def suite_folder(root: Path) -> Path:
    """``root/suite``: the shipped ``asv.aiter.conf.json`` unchanged and the shipped ``benchmarks``, so the
    config's ``"repo": "../aiter"`` names the fake checkout and its output folders land in ``root/suite``."""
    suite = root / "suite"
    suite.mkdir()
    shutil.copy(ROOT / "asv.aiter.conf.json", suite / "asv.aiter.conf.json")
    (suite / "benchmarks").symlink_to(ROOT / "benchmarks", target_is_directory=True)
    return suite / "asv.aiter.conf.json"


def _site_line() -> str:
    return f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n"


def make_existing_env(root: Path) -> str:
    """A virtualenv that sees this interpreter's packages (torch, mla_fp8_bench, asv) through a .pth."""
    env = root / "venv"
    subprocess.run([sys.executable, "-m", "virtualenv", "-q", str(env)], check=True, capture_output=True)
    py = str(env / "bin" / "python")
    site = subprocess.run([py, "-c", "import site; print(site.getsitepackages()[0])"], check=True,
                          capture_output=True, text=True).stdout.strip()
    Path(site, "_inherit_parent_site.pth").write_text(_site_line())
    return py


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("history")
    home = root / "home"
    home.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))  # asv's ~/.asv-machine.json
        mp.setenv("MLA_FP8_BENCH_AITER_ANY_DEVICE", "1")
        mp.setenv("MLA_FP8_BENCH_DEVICE", "cpu")
        mp.setenv("MLA_FP8_BENCH_SAMPLES", "5")
        mp.setenv("MLA_FP8_BENCH_TIME_BUDGET", "1")
        mp.setenv("OMP_NUM_THREADS", "1")
        mp.setenv("ASV_PYTHONPATH", str(ROOT))  # asv clears PYTHONPATH: this checkout's suite, not an installed one
        for k in ("MLA_FP8_BENCH_BACKENDS", "MLA_FP8_BENCH_CASES", "PYTHONPATH"):
            mp.delenv(k, raising=False)
        lib, shas = make_fake_aiter(root)
        conf = suite_folder(root)
        yield {"root": root, "lib": lib, "shas": shas, "conf": conf, "suite": conf.parent,
               "results": conf.parent / "results-aiter", "py": make_existing_env(root)}


def _asv(world, *args, timeout=900, env=None):
    cmd = [sys.executable, "-m", "asv", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=world["suite"], timeout=timeout,
                       env={**os.environ, **(env or {})})
    return p, p.stdout + p.stderr


#: Wheels asv installs into each managed environment (``wheel``, ``asv_runner`` and what they need), put
#: there once by ``.ci/run``; the test installs from here only (PIP_NO_INDEX), never from the network.
WHEELHOUSE = Path(os.environ.get("MLA_FP8_BENCH_WHEELHOUSE") or Path.home() / ".cache" / "mla-fp8-bench" / "wheelhouse")
WHEELHOUSE_CMD = f"python -m pip download asv_runner==0.3.2 wheel pympler build -d {WHEELHOUSE}"


def _wheelhouse_ready() -> bool:
    names = [w.name.lower() for w in WHEELHOUSE.glob("*.whl")] if WHEELHOUSE.is_dir() else []
    return any(n.startswith("asv_runner-0.3.2") for n in names) and any(n.startswith("wheel-") for n in names)


@pytest.mark.slow
def test_asv_run_publish_find_on_the_library_history(world):
    """``asv run`` over the fake AITER's commits, ``asv publish`` shows both steps, ``asv find`` names both:
    the shipped config on a local checkout, no network."""
    if shutil.which(f"python{sys.version_info[0]}.{sys.version_info[1]}") is None:
        pytest.skip(f"asv-managed virtualenvs need python{sys.version_info[0]}.{sys.version_info[1]} on PATH")
    if not _wheelhouse_ready():
        pytest.skip(f"asv-managed environments need asv_runner and wheel from a local wheelhouse: {WHEELHOUSE_CMD}")
    shas, conf = world["shas"], str(world["conf"])
    # asv_runner drops PYTHONPATH entries from sys.path before discovery, but a sitecustomize on it has
    # already run: it appends this interpreter's site-packages (torch, the editable suite) after the env's own
    inherit = world["root"] / "inherit"
    inherit.mkdir(exist_ok=True)
    (inherit / "sitecustomize.py").write_text(_site_line())
    env = {"ASV_PYTHONPATH": f"{inherit}{os.pathsep}{ROOT}", "MLA_FP8_BENCH_BACKENDS": "aiter",
           "MLA_FP8_BENCH_CASES": CASE, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(WHEELHOUSE)}
    pyver = f"virtualenv:{sys.version_info[0]}.{sys.version_info[1]}"
    p, out = _asv(world, "machine", "--yes", "--machine", "e2e", "--config", conf)
    assert p.returncode == 0, out
    p, out = _asv(world, "run", "--config", conf, "-E", pyver, "--machine", "e2e", "--show-stderr",
                  "-b", f"{ACC_BENCH}|{LAT_BENCH}", "ALL", env=env)
    assert p.returncode == 0, out[-4000:]
    p, out = _asv(world, "publish", "--config", conf)
    assert p.returncode == 0, out[-3000:]
    html = world["suite"] / "html-aiter"
    # the graph series: every commit has a value, and the steps sit exactly at the faulty commits
    acc = _series(html, "track_max_abs_error", shas)
    lat = _series(html, "track_latency", shas)
    assert all(v is not None for v in acc + lat), (acc, lat)
    assert max(acc[:ACC_FAULT]) < ACC_THRESHOLD < min(acc[ACC_FAULT:]), acc
    assert max(lat[:LAT_FAULT]) < SLEEP_S / 2 < min(lat[LAT_FAULT:]), lat
    # and the Regressions page lists both steps, each at its commit: entries are [name, graph, params, idx,
    # last value, best value, [[revision before, revision of the jump, old, new], ...]]
    regs = json.loads((html / "regressions.json").read_text())["regressions"]
    rev_hash = json.loads((html / "index.json").read_text())["revision_to_hash"]
    jumps = {r[0]: {rev_hash[str(j[1])]: j[3] / j[2] for j in r[6]} for r in regs}
    acc_jumps = jumps[f"bench_mla_prefill.MLAPrefill.track_max_abs_error('aiter', '{CASE}')"]
    lat_jumps = jumps[f"bench_mla_prefill.MLAPrefill.track_latency('aiter', '{CASE}')"]
    assert list(acc_jumps) == [shas[ACC_FAULT]] and acc_jumps[shas[ACC_FAULT]] > 10, regs
    # latency on a loaded CPU also moves by more than the 5% threshold between good commits; the
    # injected step is the one > 10x (the graph assertions above pin it to its commit)
    assert [c for c, ratio in lat_jumps.items() if ratio > 10] == [shas[LAT_FAULT]], regs
    for bench, expect in ((ACC_BENCH, ACC_FAULT), (LAT_BENCH, LAT_FAULT)):
        p, out = _asv(world, "find", "--config", conf, "-E", pyver, "--machine", "e2e", "--skip-save",
                      f"{shas[0]}..{shas[-1]}", bench, env=env)
        m = re.search(r"Greatest regression found: ([0-9a-f]+)", out)
        assert p.returncode == 0 and m, out[-3000:]
        assert shas[expect].startswith(m.group(1)), (bench, m.group(1), shas)


def _series(html: Path, metric: str, shas: list[str]) -> list[float | None]:
    """Values of ``MLAPrefill.<metric>`` for ('aiter', CASE) per commit, in history order, from the site."""
    files = [f for f in html.glob(f"graphs/**/bench_mla_prefill.MLAPrefill.{metric}.json") if "machine-e2e" in str(f)]
    assert len(files) == 1, files
    index = json.loads((html / "index.json").read_text())
    revs = {h: int(r) for r, h in index["revision_to_hash"].items()}
    params = index["benchmarks"][f"bench_mla_prefill.MLAPrefill.{metric}"]["params"]
    col = params[0].index("'aiter'") * len(params[1]) + params[1].index(f"'{CASE}'")
    by_rev = {int(row[0]): row[1] for row in json.loads(files[0].read_text())}
    return [by_rev.get(revs[s])[col] if by_rev.get(revs[s]) else None for s in shas]


@pytest.mark.slow
def test_nightly_keys_history_by_the_installed_commit_and_gates(world, capsys):
    """``mla-fp8-bench nightly`` reads the installed fake AITER's commit (pip's direct_url.json), stores the
    result under that commit, and exits 1 when the next night's accuracy regressed."""
    from mla_fp8_bench.cli import main

    py, lib, shas = world["py"], world["lib"], world["shas"]
    args = ["nightly", "--machine", "nightly", "--python", py, "--config", str(world["conf"]), "--no-publish",
            "--bench", f"{ACC_BENCH}|{LAT_BENCH}", "--format", "markdown"]
    rcs = {}
    for i in (ACC_FAULT - 1, ACC_FAULT):
        subprocess.run([py, "-m", "pip", "install", "--force-reinstall", "--no-deps", "--no-build-isolation", "-q",
                        f"git+file://{lib}@{shas[i]}"], check=True, capture_output=True)
        t0 = time.perf_counter()
        rcs[i] = main(args)
        print(f"nightly at commit {i}: {time.perf_counter() - t0:.1f} s")
    out = capsys.readouterr().out
    assert rcs == {ACC_FAULT - 1: 0, ACC_FAULT: 1}, out[-4000:]
    assert f"at {shas[ACC_FAULT][:12]}" in out and "direct_url" in out
    stored = sorted(f.name[:8] for f in (world["results"] / "nightly").glob("*-existing*.json"))
    assert stored == sorted(s[:8] for s in (shas[ACC_FAULT - 1], shas[ACC_FAULT])), stored


def test_nightly_dry_run_and_clear_errors(world, capsys, tmp_path):
    from mla_fp8_bench.cli import main

    assert main(["nightly", "--machine", "n", "--python", sys.executable, "--dry-run"]) == 2
    assert "neither AITER (amd-aiter) nor vLLM is installed" in capsys.readouterr().out
    assert main(["nightly", "--machine", "n", "--library", "aiter", "--checkout", str(tmp_path),
                 "--python", sys.executable, "--dry-run"]) == 2
    assert "is not a git checkout" in capsys.readouterr().out
    assert main(["nightly", "--machine", "n", "--library", "rocm", "--dry-run"]) == 2
    assert "--library 'rocm' is unknown" in capsys.readouterr().out
    lib, shas = world["lib"], world["shas"]
    assert main(["nightly", "--machine", "n", "--library", "aiter", "--checkout", str(lib), "--python",
                 sys.executable, "--config", str(world["conf"]), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"--set-commit-hash {shas[-1]}" in out and "-E existing:" in out and "MLA_FP8_BENCH_BACKENDS=aiter" in out


def test_ci_templates_are_valid_and_call_nightly():
    """The GitHub Actions workflow and the Buildkite step parse as YAML and run ``mla-fp8-bench nightly``."""
    import yaml

    gh = yaml.safe_load((ROOT / ".github" / "workflows" / "mla-fp8-bench-gfx950.yml").read_text())
    on = gh.get("on", gh.get(True))  # YAML 1.1 reads a bare `on` key as True
    assert {"schedule", "pull_request"} <= set(on), on
    job = gh["jobs"]["measure"]
    assert job["runs-on"] == ["self-hosted", "linux", "gfx950"]
    runs = " ".join(st.get("run", "") for st in job["steps"])
    assert "mla-fp8-bench nightly --library aiter" in runs and "--format markdown" in runs
    assert "gh pr comment" in runs
    bk = yaml.safe_load((ROOT / ".buildkite" / "mla-fp8-bench.yml").read_text())
    cmds = " ".join(bk["steps"][0]["commands"])
    assert "mla-fp8-bench nightly --library vllm" in cmds and "buildkite-agent annotate" in cmds
    # the nightly options the templates use exist
    from mla_fp8_bench.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    opts = {o for a in sub.choices["nightly"]._actions for o in a.option_strings}
    checked = 0
    for text in (runs, cmds):  # every option of every nightly call, continuation lines included
        for m in re.finditer(r"mla-fp8-bench nightly((?:[^\n]*\\\n)*[^\n]*)", text):
            for flag in re.findall(r"--[a-z][a-z-]*", m.group(1)):
                assert flag in opts, flag
                checked += 1
    assert checked >= 8, checked
