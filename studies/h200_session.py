#!/usr/bin/env python3
"""One device session on an NVIDIA H200: everything the suite needs measured there, in one call.

Run from the repository root on the device machine, with the wheels carried in ``.whl``
(``fa3-fwd==0.0.3`` tagged manylinux_2_24, ``asv==0.6.6`` (cp36-abi3, it has a compiled extension),
``asv_runner==0.3.2``, ``json5``, ``importlib-metadata`` + ``lazy-importer``, ``pympler``; the image has
the rest). Device call (the workstation first runs ``git bundle create .whl/repo.bundle --all``; ``carry: [".whl"]``)::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl; export PYTHONPATH=/tmp/site:$PWD
    python3 studies/h200_session.py --out $OUT --deadline 540

(or, smaller, the ``.git`` of a depth-1 clone as ``.whl/repo-git.tar.xz``: ``git clone --depth 1 --no-checkout
file://$PWD /tmp/d && tar cJf .whl/repo-git.tar.xz -C /tmp/d .git``).

Steps (``--steps``, run in the order given, default ``env,smoke,asv,ceilings,cv,sweep,pytest``; each
runs in its own subprocess, its log goes to ``logs/``):

``env``       ``nvidia-smi``, ``python -m mla_fp8_bench.cli env``, tree/.git check
``smoke``     ``cli run`` of fa3-fp8 and fa3-bf16 on s2048 (JSON), aiter-emulated on s512 (cost probe)
``pytest``    ``pytest tests/test_gpu.py``
``ceilings``  ``studies/ceilings.py`` (fp8/bf16 GEMM 8192^3, copy)
``cv``        ``--cv-procs`` separate processes of ``studies/profcheck.py`` for fa3-fp8
              at s128/s2048/s8192/s32768 (graph timing + profiler cross-check), then the CV summary;
              one process each for fa3-bf16 and torch-sdpa-bf16 (profiler cross-check)
``sweep``     ``cli run --json`` over the sweep s128..s32768 for fa3-fp8, fa3-bf16, torch-sdpa-bf16 with
              the device ceilings attached in the same process (``ceilings.attach``), plus
              aiter-emulated capped at ``--emu-max-seq`` (its latency is an emulation's)
``order``     ``studies/order_check.py`` in separate processes, sorted / reversed / shuffled
              (``--order-rounds`` rounds), then their summary: run-order independence of the GPU grid
``sbs``       ``studies/side_by_side.py`` in ``--sbs-procs`` processes of alternating order (the suite vs
              nvbench, Triton, torch.utils.benchmark and the profiler span), then the summary
``ab``        ``studies/latency_ab.py`` on fa3-fp8 ``--ab-case``: A/A and +1/2/3/5% device-kernel slowdowns
``cudnn``     the runner on cudnn-fp8, cudnn-bf16 and fa3-fp8 over the sweep, ragged and ctx/prefix cases
``abtrials``  ``studies/ab_trials.py``: ``mla-fp8-bench ab`` A/A and +3 % trials (an FA3 install with a
              calibrated extra kernel, or with ``--ab-pad-injection`` a padded sequence on large cases),
              ``--ab-trials`` of each, ``--ab-rounds`` rounds per side
``after``     ``studies/after_effect.py`` in two processes: the small-case state before and after a large case
``sets``      ``studies/buffer_sets.py``: small cases over 8 segment-separated buffer sets in 6 processes
``asv-tiny``  a one-parameter ``asv run --dry-run`` (plumbing and spawn cost)
``asv-tiny-fork`` the same with ``--launch-method forkserver``
``asv``       the suite's asv run on this machine: ``asv machine`` (machine ``h200`` with a ``gpu`` key and a
              stable ``os``), then ``asv run -E existing:<python3> --set-commit-hash <HEAD>
              --launch-method <forkserver|spawn> --record-samples`` restricted (``-b``) to the GPU-relevant
              backends (``--asv-backends``) and cases (``--asv-cases``); the results directory is kept

Launch method. asv starts one process per (benchmark, parameter): 8 tracks x 14 cases x 4 backends
= 448 processes plus 42 for ``AiterPlan``. On the H200 machine a spawned benchmark process cost about
0.55 s (python start-up of the image's venv, asv_runner, the suite's import), so ``spawn`` needs
about 325 s (run 2 was killed at 270 s with one track left); ``forkserver`` forks from a process that
has imported the suite and took 55 s in all (run 3). ``forkserver`` is safe here because nothing in
the suite initialises CUDA at import time (torch is imported lazily, in ``setup_cache``).

Outputs: ``$OUT/session.tar.gz`` (everything: logs, JSON, the asv results directory), refreshed
after every step so a kill at the time limit still returns what was done, plus ``$OUT/summary.json``
and ``$OUT/session.log``.

The commit for ``--set-commit-hash``: ``.git`` travels with the working tree but without a usable
HEAD (seen on the first H200 session: ``git rev-parse HEAD`` said "unknown revision"), so the bundle
``.whl/repo.bundle`` (made on the workstation with ``git bundle create .whl/repo.bundle --all``) is
cloned and its ``.git`` put in place; the HEAD of that repository is the commit the results are
filed under. The measured code is the working tree that travelled.

aiter-emulated: a Python loop over the plan's works, so its cost grows with S^2 (seconds per call at
S=8k on a GPU). It enters the asv grid only if ``backends/aiter_emulated.py`` honours
``MLA_FP8_BENCH_EMU_MAX_TOKENS`` (set to ``--emu-max-seq``); otherwise it is measured only in the
capped ``sweep`` step. Its latency is an emulation's, never a kernel's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
GPU_BACKENDS = ("fa3-fp8", "fa3-bf16", "torch-sdpa-bf16", "torch-fp8-ref", "cudnn-fp8", "cudnn-bf16", "aiter-emulated",
                "aiter", "vllm-aiter")
CV_CASES = "s128,s2048,s8192,s32768"
SWEEP = "s128,s256,s512,s1024,s2048,s4096,s8192,s16384,s32768"
ALL_STEPS = ("env", "smoke", "pytest", "ceilings", "cv", "sweep", "asv-tiny", "asv-tiny-fork", "asv", "order", "sbs",
             "ab", "cudnn", "abtrials", "after", "sets")
#: Orders of the order-independence processes (studies/order_check.py), the first one on a fresh machine.
ORDERS = ("sorted", "reversed", "shuffled")
#: The GPU grid of the order check (studies/h200-measurements.md, 10.2 and 11.2): 33 params of the H200 asv grid.
ORDER_BACKENDS = "fa3-fp8,fa3-bf16,cudnn-fp8"
ORDER_CASES = SWEEP + ",ragged-6992-6896-2495,ragged-4096x4"
#: Cases of the cuDNN peer sweep: the sweep, ragged and edge cases, context-chunk and prefix cases.
CUDNN_CASES = SWEEP + (",ragged-6992-6896-2495,ragged-4096x4,s255,ctx1024-q256,ctx-ragged-4096q512-2048q256,"
                       "prefix1024-q300")
#: Default order: cheap checks, then the asv run, then the studies (about 5-6 minutes on an H200).
DEFAULT_STEPS = ("env", "smoke", "asv", "ceilings", "cv", "sweep", "pytest")


class Session:
    def __init__(self, out: Path, work: Path, deadline_s: float):
        self.out, self.work = out, work
        self.t0 = time.monotonic()
        self.deadline = self.t0 + deadline_s
        self.summary: dict = {"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "steps": {},
                              "host": platform.node(), "python": sys.executable}
        (work / "logs").mkdir(parents=True, exist_ok=True)
        self.log_f = open(work / "session.log", "a", buffering=1)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def log(self, msg: str) -> None:
        line = f"[{time.monotonic() - self.t0:7.1f}s] {msg}"
        print(line, flush=True)
        self.log_f.write(line + "\n")

    def sh(self, name: str, cmd: list[str] | str, timeout: float, env: dict | None = None,
           cwd: Path | None = None) -> tuple[int, float]:
        """Run ``cmd``; stdout+stderr to logs/<name>.log with elapsed-time prefixes; returns (rc, wall)."""
        timeout = max(5.0, min(timeout, self.left() - 15))
        e = dict(os.environ)
        e["PYTHONUNBUFFERED"] = "1"
        if env:
            e.update(env)
        logp = self.work / "logs" / f"{name}.log"
        t0 = time.monotonic()
        self.log(f"$ {cmd if isinstance(cmd, str) else ' '.join(cmd)}  (timeout {timeout:.0f}s)")
        with open(logp, "a") as lf:
            lf.write(f"$ {cmd}\n")
            p = subprocess.Popen(cmd, shell=isinstance(cmd, str), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 env=e, cwd=cwd or ROOT, text=True, errors="replace", start_new_session=True)
            rc = None
            try:
                assert p.stdout is not None
                for line in p.stdout:
                    lf.write(f"{time.monotonic() - t0:7.2f} {line}")
                    if time.monotonic() - t0 > timeout:
                        raise subprocess.TimeoutExpired(cmd, timeout)
                rc = p.wait(timeout=max(1.0, timeout - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait()
                rc = 124
                lf.write(f"\n!! killed after {timeout:.0f}s\n")
        wall = time.monotonic() - t0
        self.log(f"  -> rc {rc} in {wall:.1f}s")
        return rc, wall

    def step(self, name: str, rc: int, wall: float, **extra) -> None:
        self.summary["steps"][name] = {"rc": rc, "wall_s": round(wall, 2), **extra}
        self.pack()

    def pack(self) -> None:
        self.summary["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        (self.work / "summary.json").write_text(json.dumps(self.summary, indent=1))
        tmp = self.out / "session.tar.gz.tmp"
        with tarfile.open(tmp, "w:gz") as tf:
            tf.add(self.work, arcname="session")
        os.replace(tmp, self.out / "session.tar.gz")
        shutil.copy(self.work / "summary.json", self.out / "summary.json")
        shutil.copy(self.work / "session.log", self.out / "session.log")


def py() -> str:
    return sys.executable


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def ensure_git(s: Session) -> str | None:
    """Make sure ROOT is a git repository with a HEAD; returns the HEAD SHA (or None)."""
    info: dict = {"git_binary": shutil.which("git")}
    r = git("rev-parse", "HEAD") if info["git_binary"] else None
    info["git_traveled"] = bool(r is not None and r.returncode == 0)
    bundle = ROOT / ".whl" / "repo.bundle"
    info["bundle"] = bundle.exists()
    shallow = ROOT / ".whl" / "repo-git.tar.xz"  # a depth-1 clone's .git: the commit without its history
    if info["git_binary"] and shallow.exists() and not bundle.exists():
        if (ROOT / ".git").exists():
            shutil.rmtree(ROOT / ".git.travelled", ignore_errors=True)
            shutil.move(str(ROOT / ".git"), str(ROOT / ".git.travelled"))
        with tarfile.open(shallow) as tf:
            tf.extractall(ROOT, filter="data")
        info["shallow_git"] = True
        info["read_tree_rc"] = git("read-tree", "HEAD").returncode
        if not git("branch", "--list", "main").stdout.strip():
            git("branch", "main", "HEAD")
        r = git("rev-parse", "HEAD")
    # the bundle is made for this call; a .git that travelled may hold another commit's HEAD (seen: the
    # HEAD of an earlier session), so the bundle always wins
    if info["git_binary"] and bundle.exists():
        tmp = Path("/tmp/repo_clone")
        shutil.rmtree(tmp, ignore_errors=True)
        c = subprocess.run(["git", "clone", "-q", "--no-checkout", str(bundle), str(tmp)], capture_output=True,
                           text=True)
        info["clone_rc"] = c.returncode
        info["clone_err"] = c.stderr[-500:]
        if c.returncode == 0:
            if (ROOT / ".git").exists():  # a travelled .git: stale HEAD or no objects
                info["travelled_git_moved_to"] = ".git.travelled"
                shutil.rmtree(ROOT / ".git.travelled", ignore_errors=True)
                shutil.move(str(ROOT / ".git"), str(ROOT / ".git.travelled"))
            shutil.move(str(tmp / ".git"), str(ROOT / ".git"))
            # the clone has no index (--no-checkout): without one every file reads as untracked and
            # the asv commit guard refuses the library; read HEAD's tree into the index only
            info["read_tree_rc"] = git("read-tree", "HEAD").returncode
            # the bundle's HEAD may be detached or on main: make sure a local 'main' exists for asv
            br = git("branch", "--list", "main").stdout.strip()
            if not br:
                git("branch", "main", "HEAD")
        r = git("rev-parse", "HEAD")
    sha = r.stdout.strip() if r is not None and r.returncode == 0 else None
    info["sha"] = sha
    if sha:
        info["head_log"] = git("log", "-1", "--format=%H %cI %s").stdout.strip()
        info["branches"] = git("branch", "-a").stdout.strip()
    s.summary["git"] = info
    s.log(f"git: {info}")
    return sha


def available_backends(names) -> tuple[list[str], dict[str, str]]:
    """Backends whose module imports (a missing module would fail the whole asv grid)."""
    from mla_fp8_bench.backends import get_backend

    ok, bad = [], {}
    for n in names:
        try:
            get_backend(n)
            ok.append(n)
        except Exception as exc:  # noqa: BLE001
            bad[n] = f"{type(exc).__name__}: {exc}"
    return ok, bad


def ensure_plain_cache(s: Session) -> None:
    """The asv ``setup_cache`` result must unpickle without importing torch.

    ``devices.environment`` stores ``torch.__version__`` (a ``torch.torch_version.TorchVersion``); in the
    pickled cache that makes every asv benchmark process import torch (1-5 s each, hundreds of
    processes). If the working tree still has that, patch the *device copy* to ``str(...)`` (a
    one-line fix the lead applies in the repository) and record it in the summary.
    """
    from mla_fp8_bench.measure.devices import environment, platform_info

    env = environment(platform_info("cpu"))
    bad = {k: type(v).__module__ + "." + type(v).__name__ for k, v in env.items()
           if v is not None and type(v) not in (str, int, float, bool)}
    s.summary["env_non_plain_types"] = bad
    if "torch" in bad:
        p = ROOT / "mla_fp8_bench" / "runner.py"
        txt = p.read_text()
        old, new = '"torch": torch.__version__,', '"torch": str(torch.__version__),'
        if old in txt:
            p.write_text(txt.replace(old, new, 1))
            s.summary["device_patches"] = [f"mla_fp8_bench/harness/runner.py: {old} -> {new} (device copy only)"]
            s.log(f"patched device copy: {old} -> {new}")


def emu_cap_supported() -> bool:
    p = ROOT / "mla_fp8_bench" / "backends" / "aiter_emulated.py"
    return p.exists() and "MLA_FP8_BENCH_EMU_MAX_TOKENS" in p.read_text()


def write_machine_file(s: Session, home: Path, machine: str) -> dict:
    """The asv machine file for ``machine``: the committed ``results/<machine>/machine.json`` when there is
    one (``mla-fp8-bench asv-machine``: facts such as RAM differ by a few MB between starts of the lent
    machine and would split the history), else ``asv machine --yes`` plus the GPU model."""
    home.mkdir(parents=True, exist_ok=True)
    env = {"HOME": str(home)}
    if (ROOT / "results" / machine / "machine.json").is_file():
        s.sh("asv-machine", [py(), "-m", "mla_fp8_bench.cli", "asv-machine", machine], 60, env=env)
        entry = json.loads((home / ".asv-machine.json").read_text()).get(machine, {})
        s.log(f"machine file (committed facts): {entry}")
        return entry
    s.sh("asv-machine", [py(), "-m", "asv", "machine", "--yes", "--machine", machine], 60, env=env)
    mf = home / ".asv-machine.json"
    data = json.loads(mf.read_text()) if mf.exists() else {"version": 1}
    entry = data.get(machine, {"machine": machine})
    gpu = None
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True)
        gpu = q.stdout.strip().splitlines()[0].strip() if q.returncode == 0 and q.stdout.strip() else None
    except OSError:
        pass
    try:
        from asv.machine import Machine

        defaults = Machine.get_defaults()
    except Exception:  # noqa: BLE001
        defaults = {"arch": platform.machine(), "num_cpu": str(os.cpu_count()), "os": platform.platform()}
    for k, v in defaults.items():
        if k != "machine" and not entry.get(k):
            entry[k] = v
    # stable facets only: asv's default 'os' carries the kernel release, which differs between
    # machines of one kind (6.18.44-fc-v657-gpu, ...-v669) and would split the history per boot
    entry["os"] = platform.system()
    entry["gpu"] = gpu or "unknown"
    data[machine] = entry
    data["version"] = 1
    mf.write_text(json.dumps(data, indent=4))
    s.log(f"machine file: {entry}")
    return entry


# ------------------------------------------------------------------------------------------ steps
def ensure_machine(c) -> None:
    s, args, asv_home = c.s, c.args, c.asv_home
    if not c.machine_done:
        s.summary["machine"] = write_machine_file(s, asv_home, args.machine)
        c.machine_done.append(True)


def do_env(c) -> None:
    s = c.s
    rc1, w1 = s.sh("env", "nvidia-smi; nvidia-smi -q -d CLOCK,POWER,PERFORMANCE | head -80; "
                   "uname -a; nproc; free -g; ls -a; git rev-parse HEAD; git status --short | head -30; "
                   f"{py()} -m pip list 2>/dev/null | grep -i -E "
                   "'torch|triton|fa3|asv|numpy|rich|json5|cudnn|cuda-bench|nvidia-ml'", 60)
    rc2, w2 = s.sh("env", [py(), "-m", "mla_fp8_bench.cli", "env"], 120)
    s.sh("env", [py(), "-c", "from mla_fp8_bench.measure.clocks import open_reader; r = open_reader(); "
                 "print('clock policy', r.policy()); print('reading', r.read())"], 30)
    s.step("env", max(rc1, rc2), w1 + w2)


def do_smoke(c) -> None:
    s, jd = c.s, c.jd
    rc, w = s.sh("smoke", [py(), "-m", "mla_fp8_bench.cli", "run", "-b", "fa3-fp8,fa3-bf16", "-c", "s2048",
                           "--json", str(jd / "smoke_s2048.json")], 180)
    rc2, w2 = s.sh("smoke", [py(), "-m", "mla_fp8_bench.cli", "run", "-b", "aiter-emulated", "-c", "s512",
                             "--samples", "5", "--time-budget", "3", "--json",
                             str(jd / "smoke_emu_s512.json")], 120)
    s.step("smoke", rc, w, emu_rc=rc2, emu_wall_s=round(w2, 1))


def do_pytest(c) -> None:
    s = c.s
    rc, w = s.sh("pytest", [py(), "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_gpu.py", "-rs"], 240)
    s.step("pytest", rc, w)


def do_ceilings(c) -> None:
    s, jd = c.s, c.jd
    code = ("import json,sys; sys.path.insert(0, 'studies'); from ceilings import measure_ceilings; "
            "r=measure_ceilings(); "
            f"json.dump(r, open({str(jd / 'ceilings.json')!r},'w'), indent=1); "
            "print({k: r.get(k) for k in ('fp8_gemm_tflops','bf16_gemm_tflops','copy_tb_s')})")
    rc, w = s.sh("ceilings", [py(), "-c", code], 120)
    s.step("ceilings", rc, w)


def do_cv(c) -> None:
    s, args, jd = c.s, c.args, c.jd
    files, t_cv, rcs = [], 0.0, []
    for i in range(args.cv_procs):
        if s.left() < 60:
            s.log("cv: stopping early, deadline")
            break
        f = jd / f"cv_fa3-fp8_p{i}.json"
        rc, w = s.sh("cv", [py(), "studies/profcheck.py", "--backend", "fa3-fp8", "--cases",
                            CV_CASES, "--json", str(f)], 150)
        rcs.append(rc)
        t_cv += w
        if rc == 0:
            files.append(str(f))
    for bk in ("fa3-bf16", "torch-sdpa-bf16"):
        if s.left() < 60:
            break
        rc, w = s.sh("cv", [py(), "studies/profcheck.py", "--backend", bk, "--cases", CV_CASES,
                            "--json", str(jd / f"cv_{bk}_p0.json")], 150)
        t_cv += w
    if files:
        s.sh("cv", [py(), "studies/profcheck.py", "--summarize", *files, "--json",
                    str(jd / "cv_summary.json")], 60)
    s.step("cv", max(rcs) if rcs else -1, t_cv, processes=len(files))


def do_sweep(c) -> None:
    s, args, jd = c.s, c.args, c.jd
    code = (
        "import sys, mla_fp8_bench.harness.runner as R\n"
        "sys.path.insert(0, 'studies'); import ceilings as C\n"
        "import mla_fp8_bench.cli as cli\n"
        "orig = R.evaluate\n"
        "def ev(*a, **k):\n"
        "    d = orig(*a, **k)\n"
        "    C.attach(d)\n"
        "    return d\n"
        "R.evaluate = ev\n"
        "sys.exit(cli.main(sys.argv[1:]))\n")
    rc, w = s.sh("sweep", [py(), "-c", code, "run", "-b", "fa3-fp8,fa3-bf16,torch-sdpa-bf16", "-c", SWEEP,
                           "--json", str(jd / "run_h200_sweep.json")], 300)
    emu_cases = ",".join(c for c in SWEEP.split(",") if int(c[1:]) <= args.emu_max_seq)
    rc2, w2 = (None, 0.0)
    if s.left() > 90:
        rc2, w2 = s.sh("sweep", [py(), "-m", "mla_fp8_bench.cli", "run", "-b", "aiter-emulated,torch-fp8-ref",
                                 "-c", emu_cases, "--samples", "5", "--time-budget", "3", "--json",
                                 str(jd / "run_h200_emulated.json")], 180)
    s.step("sweep", rc, w, emu_rc=rc2, emu_wall_s=round(w2, 1))


def do_asv_tiny(c, method: str) -> None:
    s, args, sha, asv_env_base = c.s, c.args, c.sha, c.asv_env_base
    ensure_machine(c)
    env = dict(asv_env_base, MLA_FP8_BENCH_BACKENDS="fa3-fp8", MLA_FP8_BENCH_MAX_TOKENS="2048")
    rc, w = s.sh(f"asv-tiny-{method}", [py(), "-m", "asv", "run", "-E", f"existing:{py()}", "--set-commit-hash",
                                        sha, "--launch-method", method, "--machine", args.machine, "--dry-run",
                                        "-b", r"MLAPrefill\.track_\w+\('fa3-fp8', 's2048'\)"], 120, env=env)
    s.step(f"asv-tiny-{method}", rc, w)


def do_asv(c) -> None:
    s, args, sha, grid, sel_run, work, asv_env_base = c.s, c.args, c.sha, c.grid, c.sel_run, c.work, c.asv_env_base
    ensure_machine(c)
    sel = [b for b in sel_run if not args.asv_backends or b in args.asv_backends.split(",")]
    env = dict(asv_env_base, MLA_FP8_BENCH_BACKENDS=",".join(b for b in grid if b in sel),
               MLA_FP8_BENCH_EMU_MAX_TOKENS=str(args.emu_max_seq))
    regex = r"\('(" + "|".join(sel) + r")'"
    if args.asv_cases:
        env["MLA_FP8_BENCH_CASES"] = args.asv_cases
        regex += r", '(" + "|".join(c.replace("-", r"\-") for c in args.asv_cases.split(",")) + r")'\)"
    plan_regex = r"AiterPlan\.\w+\('aiter-emulated'"
    rc, w = s.sh("asv", [py(), "-m", "asv", "run", "-E", f"existing:{py()}", "--set-commit-hash", sha,
                         "--launch-method", args.launch_method, "--machine", args.machine, "--record-samples",
                         "-b", regex, "-b", plan_regex], args.asv_timeout, env=env)
    dst = work / "asv_results"
    dst.mkdir(exist_ok=True)
    if (ROOT / "results" / args.machine).exists():
        shutil.copytree(ROOT / "results" / args.machine, dst / args.machine, dirs_exist_ok=True)
    if (ROOT / "results" / "benchmarks.json").exists():
        shutil.copy(ROOT / "results" / "benchmarks.json", dst / "benchmarks.json")
    s.step("asv", rc, w, regex=[regex, plan_regex], launch_method=args.launch_method)


def _process_rounds(s, name: str, script: str, runs: list[tuple[Path, list[str]]], timeout: float,
                    summary: Path) -> None:
    """Run ``script`` once per (json path, extra args) in separate processes while time is left, then
    ``script --summarize`` over the JSONs that were written; one step record for all of them."""
    files, t, rcs = [], 0.0, []
    for f, extra in runs:
        rc, w = s.sh(name, [py(), script, *extra, "--json", str(f)], timeout)
        t += w
        rcs.append(rc)
        if rc == 0:
            files.append(str(f))
        if s.left() < 60:
            break
    if files:
        s.sh(name, [py(), script, "--summarize", *files, "--json", str(summary)], 30)
    s.step(name, max(rcs) if rcs else -1, t, processes=len(files))


def do_order(c) -> None:
    s, args, jd = c.s, c.args, c.jd
    tracked = ["--tracked-rounds", str(args.order_tracked_rounds)] if args.order_tracked_rounds else []
    runs = [(jd / f"order_p{i}_{order}.json",
             ["--order", order, "--seed", str(i + 1), "--backends", args.order_backends, "--cases", args.order_cases,
              *tracked])
            for i, order in enumerate(args.orders.split(",") * args.order_rounds)]
    _process_rounds(s, "order", "studies/order_check.py", runs, 60 + 30 * max(1, args.order_tracked_rounds),
                    jd / "order_summary.json")  # a tracked round of the 33 params took 25-28 s on the H200


def do_sbs(c) -> None:
    s, args, jd = c.s, c.args, c.jd
    runs = []
    for i in range(args.sbs_procs):
        order = "sorted" if i % 2 == 0 else "reversed"
        nvbench = str(jd / f"nvbench_p{i}.json")
        runs.append((jd / f"sbs_p{i}_{order}.json", ["--order", order, "--nvbench-json", nvbench]))
    _process_rounds(s, "sbs", "studies/side_by_side.py", runs, 120, jd / "sbs_summary.json")


def do_ab(c) -> None:
    s, args, jd = c.s, c.args, c.jd
    rc, w = s.sh("ab", [py(), "studies/latency_ab.py", "--backend", "fa3-fp8", "--case", args.ab_case,
                        "--aa", "10", "--reps", "10", "--slowdowns", "0.01,0.02,0.03,0.05",
                        "--deadline", str(max(30.0, min(200.0, s.left() - 40))),
                        "--out", str(jd / "latency_ab.json")], 260)
    s.step("ab", rc, w)


def do_abtrials(c) -> None:
    s, args, jd = c.s, c.args, c.jd
    rc, w = s.sh("abtrials", [py(), "studies/ab_trials.py", "--work", "/tmp/ab_trials", "--out",
                              str(jd / "ab_trials.json"), "--trials", str(args.ab_trials), "--rounds",
                              str(args.ab_rounds), "--cases", args.ab_cases,
                              "--deadline", str(max(20.0, s.left() - args.ab_reserve))]
                 + (["--pad-injection"] if args.ab_pad_injection else []),
                 s.left() - args.ab_reserve + 50)
    s.step("abtrials", rc, w)


def do_after(c) -> None:
    s, jd = c.s, c.jd
    t = 0.0
    rcs = []
    for i in range(2):
        rc, w = s.sh("after", [py(), "studies/after_effect.py", "--small", "s512", "--large", "s8192", "--json",
                               str(jd / f"after_p{i}.json")], 60)
        t += w
        rcs.append(rc)
    s.step("after", max(rcs), t)


def do_sets(c) -> None:
    s, args, jd = c.s, c.args, c.jd
    rc, w = s.sh("sets", [py(), "studies/buffer_sets.py", "--procs", "6", "--cases", args.sets_cases,
                          "--sets", str(args.sets_per_process), "--samples", str(args.sets_samples),
                          "--settle-s", str(args.sets_settle_s),
                          "--deadline", str(max(0.0, s.left() - 90)), "--json", str(jd / "buffer_sets.json")],
                 max(60.0, s.left() - 10))
    s.step("sets", rc, w)


def do_cudnn(c) -> None:
    s, jd = c.s, c.jd
    code = ("import json, sys\n"
            "from mla_fp8_bench.harness.runner import evaluate\n"
            "from mla_fp8_bench.problem.cases import resolve_cases\n"
            "d = evaluate(sys.argv[1].split(','), resolve_cases(sys.argv[2].split(',')))\n"
            "json.dump(d, open(sys.argv[3], 'w'), indent=1, default=str)\n"
            "for r in d['records']:\n"
            "    print(r['backend'], r['case'], r['status'], r.get('latency_s'), r.get('tflops'),\n"
            "          r.get('max_abs_error_fp8_ref'), r.get('rel_l2_error_fp8_ref'), r.get('reason', '')[:400])\n")
    rc, w = s.sh("cudnn", [py(), "-c", code, "cudnn-fp8,cudnn-bf16,fa3-fp8", CUDNN_CASES,
                           str(jd / "cudnn_sweep.json")], 200)
    s.step("cudnn", rc, w)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/h200_out"))
    ap.add_argument("--work", default="/tmp/h200_session")
    ap.add_argument("--deadline", type=float, default=540.0, help="seconds for the whole session")
    ap.add_argument("--steps", default=",".join(DEFAULT_STEPS), help=f"comma-separated, run in the order given; "
                    f"known: {','.join(ALL_STEPS)}")
    ap.add_argument("--cv-procs", type=int, default=6)
    ap.add_argument("--emu-max-seq", type=int, default=4096)
    ap.add_argument("--asv-timeout", type=float, default=300.0)
    ap.add_argument("--launch-method", default="forkserver", choices=("spawn", "forkserver"),
                    help="asv launch method of the full run (default forkserver: measured 55 s on an H200 "
                         "against an estimated 325 s with spawn; the suite initialises no GPU at import)")
    ap.add_argument("--machine", default="h200")
    ap.add_argument("--order-rounds", type=int, default=1, help="rounds of the sorted/reversed/shuffled processes")
    ap.add_argument("--order-tracked-rounds", type=int, default=0,
                    help="order: compare the tracked figure (median over this many rounds) per order")
    ap.add_argument("--order-backends", default=ORDER_BACKENDS)
    ap.add_argument("--orders", default=",".join(ORDERS), help="order: the orders, one process each")
    ap.add_argument("--order-cases", default=ORDER_CASES)
    ap.add_argument("--sbs-procs", type=int, default=5, help="side-by-side processes (alternating order)")
    ap.add_argument("--ab-case", default="s8192", help="case of the sensitivity trials")
    ap.add_argument("--ab-trials", type=int, default=5, help="abtrials: trials of each kind (A/A, +3 %%)")
    ap.add_argument("--sets-cases", default="s128,s512,s2048", help="sets: the cases")
    ap.add_argument("--sets-per-process", type=int, default=8, help="sets: input sets per process and case")
    ap.add_argument("--sets-samples", type=int, default=30, help="sets: time_device samples per set")
    ap.add_argument("--sets-settle-s", type=float, default=0.15, help="sets: time_device warmup_s per set")
    ap.add_argument("--ab-cases", default="s512,s8192", help="abtrials: the cases of every trial")
    ap.add_argument("--ab-rounds", type=int, default=4, help="abtrials: rounds per side of each ab run")
    ap.add_argument("--ab-pad-injection", action="store_true",
                    help="abtrials: large cases slowed by a padded sequence (more work), not an extra kernel")
    ap.add_argument("--ab-reserve", type=float, default=60.0, help="abtrials: seconds left for the steps after it")
    ap.add_argument("--asv-backends", default="", help="asv: only these backends (comma-separated)")
    ap.add_argument("--asv-cases", default="", help="asv: only these case ids (MLA_FP8_BENCH_CASES)")
    args = ap.parse_args()

    out, work = Path(args.out), Path(args.work)
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    s = Session(out, work, args.deadline)
    steps = [x for x in args.steps.split(",") if x]
    unknown = [x for x in steps if x not in ALL_STEPS]
    if unknown:
        print(f"unknown steps {unknown}: allowed {ALL_STEPS}")
        return 2
    s.summary["args"] = vars(args)
    jd = work / "json"
    jd.mkdir()
    sha = ensure_git(s)
    if not (ROOT / "benchmarks" / "__init__.py").exists():
        (ROOT / "benchmarks" / "__init__.py").write_text("")
        s.summary["created_benchmarks_init"] = True
    if any(x.startswith("asv") for x in steps):
        ensure_plain_cache(s)
    ok_backends, bad_backends = available_backends(GPU_BACKENDS)
    s.summary["backend_modules_missing"] = bad_backends
    s.pack()

    asv_home = Path("/tmp/asvhome")
    asv_env_base = {"HOME": str(asv_home), "ASV_PYTHONPATH": os.environ.get("PYTHONPATH", ""),
                    "MLA_FP8_BENCH_EXPECT_COMMIT": sha or ""}
    grid = [b for b in ok_backends if b != "aiter-emulated" or emu_cap_supported()]
    sel_run = [b for b in grid if b in ("fa3-fp8", "fa3-bf16", "torch-sdpa-bf16", "torch-fp8-ref", "cudnn-fp8",
                                        "cudnn-bf16", "aiter-emulated")]
    s.summary["asv_grid_backends"] = grid
    s.summary["asv_selected_backends"] = sel_run
    s.summary["emu_cap_supported"] = emu_cap_supported()
    c = SimpleNamespace(s=s, args=args, jd=jd, sha=sha, grid=grid, sel_run=sel_run, work=work, asv_home=asv_home,
                        asv_env_base=asv_env_base, machine_done=[])
    table = {"abtrials": (do_abtrials, 60), "after": (do_after, 30), "sets": (do_sets, 120), "order": (do_order, 60),
             "sbs": (do_sbs, 60),
             "ab": (do_ab, 60),
             "cudnn": (do_cudnn, 40),
             "env": (do_env, 10), "smoke": (do_smoke, 60), "pytest": (do_pytest, 60), "ceilings": (do_ceilings, 40),
             "cv": (do_cv, 90), "sweep": (do_sweep, 90), "asv-tiny": (lambda c: do_asv_tiny(c, "spawn"), 40),
             "asv-tiny-fork": (lambda c: do_asv_tiny(c, "forkserver"), 40), "asv": (do_asv, 60)}
    for name in steps:
        fn, need = table[name]
        if name.startswith("asv") and not sha:
            s.log(f"skip {name}: no git commit to file results under")
            continue
        if s.left() < need:
            s.log(f"skip {name}: {s.left():.0f}s left, needs {need}s")
            s.summary["steps"][name] = {"skipped": f"deadline ({s.left():.0f}s left)"}
            continue
        try:
            fn(c)
        except Exception as exc:  # noqa: BLE001 - a broken step must not lose the others
            s.log(f"step {name} raised {type(exc).__name__}: {exc}")
            s.summary["steps"][name] = {"error": f"{type(exc).__name__}: {exc}"}
            s.pack()
    s.summary["finished"] = True
    s.pack()
    s.log(json.dumps({k: v for k, v in s.summary["steps"].items()}, indent=None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
