"""Bisection end to end on a fake AITER history: ``mla-fp8-bench bisect`` (existing env + git bisect run)
and ``asv find`` (asv-managed virtualenvs) each name the commit that introduced each fault.

The fake library ``fakeaiter`` exposes AITER's four PS-prefill primitives (the suite's stand-in
``aiter`` over the emulator, so :class:`~mla_fp8_bench.backends.aiter_real.AiterPsDriver` drives it
exactly like the real one) with a per-commit setting: 8 commits, the 4th injects ``drop_v_descale`` (an
accuracy fault), the 6th a ``time.sleep`` in the kernel (a latency fault). A tiny asv suite measures
``track_max_abs_error`` and ``track_latency`` (samples) of ``s128-h8`` through it.

Torch is not installed per environment: each environment (the bisect one, created here with
``virtualenv``; and asv's managed ones) gets a ``.pth`` that adds this interpreter's site-packages
(``site.addsitedir``, so its editable installs work). ``VIRTUALENV_SYSTEM_SITE_PACKAGES`` cannot do
that here: this interpreter is itself a venv, and a virtualenv's "system" site-packages are those of the
*base* interpreter, which has no torch. The asv-managed part needs PyPI (asv installs asv_runner, build,
pympler, wheel into each new environment); it is skipped, saying so, when PyPI is unreachable.
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
from pathlib import Path

import pytest

from mla_fp8_bench.analysis.bisect import run_bisect

ACC_FAULT_COMMIT = 3  # index of the commit that injects drop_v_descale
LAT_FAULT_COMMIT = 5  # index of the commit that adds the sleep
SLEEP_S = 0.6

INIT = '''"""fakeaiter: an AITER-API-compatible test library over mla_fp8_bench's emulator."""
import time as _time

from mla_fp8_bench.aiter_ps.standin import make_standin_aiter as _make

from ._settings import CU_NUM, FAULTS, SLEEP_S

__version__ = "0.1.20"
_m = _make(faults=FAULTS or None, cu_num=CU_NUM, aiter_version=(0, 1, 20))
get_ps_metadata_info_v1 = _m.get_ps_metadata_info_v1
get_ps_metadata_v1 = _m.get_ps_metadata_v1
mla_reduce_v1 = _m.mla_reduce_v1


def mla_prefill_ps_asm_fwd(*args, **kwargs):
    if SLEEP_S:
        _time.sleep(SLEEP_S)
    return _m.mla_prefill_ps_asm_fwd(*args, **kwargs)
'''

BENCH = '''import time


class FakeAiterPrefill:
    timeout = 600
    version = "fake-v1"

    def setup(self):
        import torch

        import fakeaiter
        from mla_fp8_bench.backends.aiter_real import AiterPsDriver
        from mla_fp8_bench.problem.cases import parse_case_id
        from mla_fp8_bench.problem.inputs import make_inputs

        torch.set_num_threads(1)
        self.inputs = make_inputs(parse_case_id("s128-h8"))
        self.prepared = AiterPsDriver(fakeaiter, (0, 1, 20)).prepare(self.inputs)

    def track_max_abs_error(self):
        from mla_fp8_bench.measure.metrics import error_metrics
        from mla_fp8_bench.measure.reference import reference_fp8_dequant

        out = self.prepared.run()
        return max(error_metrics(out, reference_fp8_dequant(self.inputs)[0]).max_abs_error, 1e-12)

    track_max_abs_error.unit = "max_abs_err"

    def track_latency(self):
        samples = []
        for _ in range(3):
            t0 = time.perf_counter()
            self.prepared.run()
            samples.append(time.perf_counter() - t0)
        return {"samples": samples, "number": 1}

    track_latency.unit = "seconds"
'''


def _git(cwd, *args):
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t", GIT_AUTHOR_DATE="2026-01-01T00:00:00", GIT_COMMITTER_DATE="2026-01-01T00:00:00")
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def make_fake_history(root: Path) -> list[str]:
    """The fakeaiter repository with 8 commits; returns their SHAs, oldest first."""
    lib = root / "fakeaiter-repo"
    (lib / "fakeaiter").mkdir(parents=True)
    _git(root, "init", "-q", "-b", "main", str(lib))
    (lib / "pyproject.toml").write_text(textwrap.dedent('''\
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "fakeaiter"
        version = "0.1.20"
        [tool.setuptools]
        packages = ["fakeaiter"]
        '''))
    (lib / "fakeaiter" / "__init__.py").write_text(INIT)
    settings = {"FAULTS": (), "SLEEP_S": 0.0}

    def write_settings():
        (lib / "fakeaiter" / "_settings.py").write_text(
            f"CU_NUM = 256\nFAULTS = {settings['FAULTS']!r}\nSLEEP_S = {settings['SLEEP_S']!r}\n")

    shas = []
    for i in range(8):
        if i == ACC_FAULT_COMMIT:
            settings["FAULTS"] = ("drop_v_descale",)
            msg = "epilogue: simplify the output scaling"
        elif i == LAT_FAULT_COMMIT:
            settings["SLEEP_S"] = SLEEP_S
            msg = "kernel: add a launch-time debug check"
        else:
            msg = f"docs: note {i}"
        write_settings()
        (lib / "NOTES.md").write_text("".join(f"note {j}\n" for j in range(i + 1)))
        _git(lib, "add", "-A")
        _git(lib, "commit", "-q", "-m", msg)
        shas.append(_git(lib, "rev-parse", "HEAD"))
    return shas


def _inherit_line() -> str:
    return f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n"


def make_suite(root: Path, lib: Path, managed: bool) -> Path:
    suite = root / ("suite-managed" if managed else "suite-existing")
    (suite / "benchmarks").mkdir(parents=True)
    (suite / "benchmarks" / "__init__.py").write_text("")
    (suite / "benchmarks" / "bench_fake.py").write_text(BENCH)
    conf = {
        "version": 1, "project": "fakeaiter", "repo": str(lib), "branches": ["main"], "dvcs": "git",
        "benchmark_dir": "benchmarks", "results_dir": "results", "html_dir": "html", "env_dir": ".asv/env",
        "launch_method": "spawn", "default_benchmark_timeout": 600,
        # -E existing:<python> ignores these, but asv still needs an environment type to parse the config
        "environment_type": "virtualenv", "pythons": [f"{sys.version_info[0]}.{sys.version_info[1]}"],
    }
    if managed:
        (suite / "inherit_site.py").write_text(
            "import site, sys\n"
            "open(site.getsitepackages()[0] + '/_inherit_parent_site.pth', 'w').write(" + repr(_inherit_line()) + ")\n")
        conf.update({
            "environment_type": "virtualenv", "pythons": [f"{sys.version_info[0]}.{sys.version_info[1]}"],
            "matrix": {"req": {"pip+asv_runner": ["0.3.2"]}},
            "build_command": ["python -m pip wheel --no-deps --no-build-isolation -w {build_cache_dir} {build_dir}"],
            "install_command": ["in-dir={env_dir} python -m pip install --no-deps {wheel_file}",
                                "python {conf_dir}/inherit_site.py"],
            "uninstall_command": ["return-code=any python -m pip uninstall -y fakeaiter"],
            "build_cache_size": 8,
        })
    (suite / "asv.conf.json").write_text(json.dumps(conf, indent=1))
    return suite


def make_env(root: Path) -> str:
    """A virtualenv that sees this interpreter's packages (torch, mla_fp8_bench, asv) through a .pth."""
    env = root / "env"
    subprocess.run([sys.executable, "-m", "virtualenv", "-q", str(env)], check=True, capture_output=True)
    py = str(env / "bin" / "python")
    site = subprocess.run([py, "-c", "import site; print(site.getsitepackages()[0])"], check=True,
                          capture_output=True, text=True).stdout.strip()
    Path(site, "_inherit_parent_site.pth").write_text(_inherit_line())
    return py


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    root = tmp_path_factory.mktemp("bisect")
    shas = make_fake_history(root)
    return root, root / "fakeaiter-repo", shas


def _asv_machine(suite: Path, py: str, name: str) -> None:
    subprocess.run([py, "-m", "asv", "machine", "--yes", "--machine", name, "--config", str(suite / "asv.conf.json")],
                   check=True, capture_output=True, cwd=suite)


@pytest.mark.parametrize("metric,threshold,expect", [
    ("track_max_abs_error", 0.5, ACC_FAULT_COMMIT),
    ("track_latency", SLEEP_S / 2 + 0.25, LAT_FAULT_COMMIT),
])
def test_bisect_command_names_the_faulty_commit(history, metric, threshold, expect):
    root, lib, shas = history
    suite = root / "suite-existing"
    if not suite.exists():
        make_suite(root, lib, managed=False)
    env_py = str(root / "env" / "bin" / "python") if (root / "env").exists() else make_env(root)
    _asv_machine(suite, env_py, "bisect")
    res = run_bisect(repo=str(lib), good=shas[0], bad=shas[-1], benchmark=f"FakeAiterPrefill.{metric}", metric=metric,
                     threshold=threshold, config=str(suite / "asv.conf.json"), python=env_py, machine="bisect")
    print(res["output"][-2500:])
    for p in res["probes"]:
        print(p)
    assert res["first_bad"] == shas[expect], (res["first_bad"], shas)
    assert all(p["verdict"] in ("good", "bad") for p in res["probes"])
    # the user's checkout is untouched and no worktree is left behind
    assert _git(lib, "rev-parse", "HEAD") == shas[-1]
    assert len(_git(lib, "worktree", "list").splitlines()) == 1


def test_bisect_command_usage_errors(history, capsys):
    from mla_fp8_bench.cli import main

    root, lib, shas = history
    base = ["bisect", "--repo", str(lib), "--metric", "track_latency", "--threshold", "1", "--benchmark", "x"]
    assert main([*base, "--good", shas[-1], "--bad", shas[0], "--config", str(lib / "pyproject.toml")]) == 2
    assert "not an ancestor" in capsys.readouterr().out
    assert main([*base, "--good", "deadbeef", "--bad", shas[0]]) == 2
    assert main([*base, "--good", shas[0], "--bad", shas[-1], "--config", str(root / "nope.json")]) == 2
    assert "does not exist" in capsys.readouterr().out


def _pypi_reachable() -> bool:
    p = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", "/tmp/_pypi_probe",
                        "asv_runner==0.3.2"], capture_output=True, timeout=60)
    return p.returncode == 0


def test_asv_find_with_managed_envs_names_each_faulty_commit(history):
    root, lib, shas = history
    if shutil.which(f"python{sys.version_info[0]}.{sys.version_info[1]}") is None:
        pytest.skip(f"asv-managed virtualenvs need python{sys.version_info[0]}.{sys.version_info[1]} on PATH")
    if not _pypi_reachable():
        pytest.skip("asv-managed environments install asv_runner/build/pympler from PyPI, which is unreachable")
    suite = make_suite(root, lib, managed=True)
    _asv_machine(suite, sys.executable, "find")
    found = {}
    for metric in ("track_max_abs_error", "track_latency"):
        p = subprocess.run([sys.executable, "-m", "asv", "find", "--skip-save", "--machine", "find", "--config",
                            str(suite / "asv.conf.json"), f"{shas[0]}..{shas[-1]}", f"FakeAiterPrefill.{metric}"],
                           capture_output=True, text=True, cwd=suite, timeout=900)
        out = p.stdout + p.stderr
        print(out[-3000:])
        m = re.search(r"Greatest regression found: ([0-9a-f]+)", out)
        assert p.returncode == 0 and m, out[-3000:]
        found[metric] = m.group(1)
    assert shas[ACC_FAULT_COMMIT].startswith(found["track_max_abs_error"])
    assert shas[LAT_FAULT_COMMIT].startswith(found["track_latency"])
