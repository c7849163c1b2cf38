"""Guards of an asv run: the code measured is the commit named, and values stored for params this run does
not measure are kept (asv replaces a benchmark's whole result row: :func:`stored_records` gives them back).
The result file is found from asv's ``ASV_*`` variables or, in ``-E existing`` runs, the parent ``asv run``
process (both in :class:`~mla_fp8_bench.config.RunConfig`). :func:`check_asv_run` runs when asv discovers
the benchmarks, so a refusal stops asv before it writes anything.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from mla_fp8_bench.config import RunConfig
from mla_fp8_bench.harness.results import AsvResult, ResultsError, load_asv_conf, load_asv_result


class AsvRunRefused(RuntimeError):
    """The asv run would measure other code than the commit named, or lose stored values."""


def git(here: str | os.PathLike, *args: str) -> str | None:
    """The output of ``git -C here args``, or None when it fails."""
    try:
        return subprocess.run(["git", "-C", str(here), *args], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def check_commit(cfg: RunConfig, library_dir: str | os.PathLike | None = None) -> None:
    """With ``MLA_FP8_BENCH_EXPECT_COMMIT`` set, refuse unless the library is that commit's tracked code
    (uncommitted edits are not detected). AsvRunRefused: the library is not in a git work tree, not
    tracked there (a copy in an ignored folder such as ``.asv/env``) or its HEAD is not the commit named."""
    expect = cfg.expect_commit
    if not expect:
        return
    here = Path(library_dir or Path(__file__).resolve().parent.parent)
    var = f"MLA_FP8_BENCH_EXPECT_COMMIT={expect}"
    if not re.fullmatch(r"[0-9a-fA-F]{7,40}", expect):
        raise AsvRunRefused(f"{var} is not a commit SHA (7-40 hex digits)")
    head = git(here, "rev-parse", "HEAD")
    if head is None:
        raise AsvRunRefused(f"{var} but the library at {here} is not in a git work tree (an installed copy): "
                            "its commit cannot be verified; install it editable from the checkout")
    if git(here, "ls-files", "--error-unmatch", "__init__.py") is None:
        raise AsvRunRefused(f"{var} but the library at {here} is not tracked by the git tree around it (a copy "
                            "installed inside the checkout, possibly stale): install it editable")
    if not head.lower().startswith(expect.lower()):
        raise AsvRunRefused(f"{var} but the library at {here} is at {head}")


def _results_dirs(conf_dir: Path) -> list[Path]:
    dirs = []
    for cfg in sorted(conf_dir.glob("asv*.json")):
        with contextlib.suppress(ValueError, AttributeError):
            dirs.append(conf_dir / load_asv_conf(cfg).get("results_dir", "results"))
    return list(dict.fromkeys(dirs)) or [conf_dir / "results"]


def _option(argv: list[str], name: str) -> str | None:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def check_overrides(cfg: RunConfig, argv: list[str] | None = None) -> None:
    """AsvRunRefused naming both when ``MLA_FP8_BENCH_MACHINE`` / ``_EXPECT_COMMIT`` contradict asv's
    ``--machine`` / ``--set-commit-hash`` (or ``ASV_COMMIT``) in ``argv`` (default: the parent ``asv run``'s)."""
    if argv is None:
        argv = list(cfg.asv_parent[1]) if cfg.asv_parent else []
    machine, asv_machine = cfg.machine, _option(argv, "--machine")
    if machine and asv_machine and machine != asv_machine:
        raise AsvRunRefused(f"MLA_FP8_BENCH_MACHINE={machine} but asv run --machine {asv_machine}: they must name "
                            "the same machine (unset MLA_FP8_BENCH_MACHINE, or make them agree)")
    expect = cfg.expect_commit.lower()
    for what, sha in (("asv run --set-commit-hash", _option(argv, "--set-commit-hash")),
                      ("ASV_COMMIT", cfg.asv.get("ASV_COMMIT"))):
        sha = (sha or "").strip().lower()
        if expect and sha and not (sha.startswith(expect) or expect.startswith(sha)):
            raise AsvRunRefused(f"MLA_FP8_BENCH_EXPECT_COMMIT={expect} but {what} {sha}: they must name the same "
                                "commit (unset MLA_FP8_BENCH_EXPECT_COMMIT, or make them agree)")


def asv_context(cfg: RunConfig) -> dict[str, Any] | None:
    """Where this asv benchmark process's results go: ``conf_dir``, ``commit``, ``machine``, ``env``
    (each may be None) and ``dry_run``, or None outside an ``asv run``."""
    parent = cfg.asv_parent
    conf = cfg.asv.get("ASV_CONF_DIR") or (parent[0] if parent else None)
    if not conf:
        return None
    argv = list(parent[1]) if parent else []
    commit = cfg.asv.get("ASV_COMMIT") or cfg.expect_commit or _option(argv, "--set-commit-hash")
    if commit and not re.fullmatch(r"[0-9a-f]{40}", commit):
        commit = git(Path(conf), "rev-parse", "--verify", "--quiet", commit + "^{commit}")
    return {"conf_dir": Path(conf), "commit": commit or None,
            "machine": cfg.machine or _option(argv, "--machine") or None, "env": cfg.asv.get("ASV_ENV_NAME"),
            "dry_run": any(a in ("--dry-run", "-n") for a in argv)}


def result_file(cfg: RunConfig) -> Path | None:
    """The asv result file this benchmark process's run will overwrite, if it exists; AsvRunRefused when
    several could be it (machines or environments) and ``MLA_FP8_BENCH_MACHINE`` does not say which."""
    ctx = asv_context(cfg)
    if ctx is None or ctx["commit"] is None:
        return None
    env = ctx["env"] or "*"
    found = sorted(p for d in _results_dirs(ctx["conf_dir"])
                   for p in d.glob(f"{ctx['machine'] or '*'}/{ctx['commit'][:8]}-{env}.json") if p.is_file())
    if len(found) > 1 and ctx["env"] is None:  # -E existing: asv names the environment after the python path
        mine = f"{ctx['commit'][:8]}-existing-py{sys.executable.replace(os.sep, '_')}.json"
        found = [p for p in found if p.name == mine] or found
    if len(found) > 1:
        raise AsvRunRefused(f"several stored asv result files could be this run's ({', '.join(map(str, found))}): "
                            "export MLA_FP8_BENCH_MACHINE=<this run's --machine> so the right file's values are kept")
    return found[0] if found else None


def check_asv_run(cfg: RunConfig) -> None:
    """Refuse an ``asv run`` that would measure the wrong code or lose data. AsvRunRefused: see
    :func:`check_overrides`, :func:`check_commit`, :func:`result_file`; a narrowed run whose commit is
    unknown; an unreadable stored result file it would overwrite."""
    ctx = asv_context(cfg)
    if ctx is None:
        return
    check_overrides(cfg)
    check_commit(cfg)
    if ctx.get("dry_run"):  # asv run --dry-run stores nothing: nothing to lose
        return
    narrowed = cfg.narrowed_by()
    if ctx["commit"] is None and narrowed:
        raise AsvRunRefused(f"{', '.join(narrowed)} narrow this run but its commit is unknown, so the stored "
                            "values of the other params could not be kept: export "
                            "MLA_FP8_BENCH_EXPECT_COMMIT=<the --set-commit-hash SHA>")
    if (path := result_file(cfg)) is not None:
        _read_results(path)


def _read_results(path: Path) -> AsvResult:
    """The stored asv result file a run would overwrite; AsvRunRefused naming it when it is unreadable."""
    try:
        return load_asv_result(path)
    except ResultsError as exc:
        raise AsvRunRefused(f"stored asv result file {path} cannot be read ({exc}): this run would overwrite "
                            "it; fix or move it first") from None


def stored_records(cfg: RunConfig, class_name: str, version: str, keys: list[tuple[str, str]]
                   ) -> dict[str, dict[str, Any]]:
    """``{"backend|case": record}`` (``status="ok"``, ``stored_from``: the file) rebuilt from the stored asv
    results of ``class_name`` under the same benchmark ``version``, for the (backend, case) ``keys`` that
    have a stored ok value."""
    path = result_file(cfg)
    if path is None or not keys:
        return {}
    from mla_fp8_bench.measure.metric_table import asv_metrics

    res = _read_results(path)
    by_track = {name.rsplit(".", 1)[-1]: name for name in res.benchmarks() if name.split(".")[-2:-1] == [class_name]}
    out: dict[str, dict[str, Any]] = {}
    for m in asv_metrics(class_name):
        name = by_track.get(m.track)
        if name is None or res.row(name).get("version") != m.asv_version(version):
            continue
        stored = res.measurements(name)
        for key in keys:
            meas = stored.get(tuple(key))
            if meas is None or meas.status != "ok":  # failed or n/a: nothing to keep
                continue
            rec = out.setdefault("|".join(key), {"backend": key[0], "case": key[1], "status": "ok",
                                                 "reason": f"not measured in this run: stored value kept ({path})",
                                                 "stored_from": str(path)})
            rec[m.record_key] = meas.value
            if m.samples_key and meas.samples:
                rec[m.samples_key] = meas.samples
    return out
