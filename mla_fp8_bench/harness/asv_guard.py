"""The guard of an ``-E existing`` asv run: the code measured is the commit named. It runs when asv
discovers the benchmarks, so a refusal stops asv before it writes anything."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from mla_fp8_bench.config import RunConfig


class AsvRunRefused(RuntimeError):
    """The asv run would measure other code than the commit named."""


def git(here: str | os.PathLike, *args: str) -> str | None:
    """The output of ``git -C here args``, or None when it fails."""
    try:
        return subprocess.run(["git", "-C", str(here), *args], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def check_commit(cfg: RunConfig, library_dir: str | os.PathLike | None = None) -> None:
    """With ``MLA_FP8_BENCH_EXPECT_COMMIT`` set, refuse unless the library is that commit's tracked code
    (uncommitted edits are not detected)."""
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
