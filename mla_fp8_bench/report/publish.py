"""``mla-fp8-bench publish``: the asv site, self-contained (it renders with no network; docs/usage.md).

``asv publish`` runs into a staging folder; every remote ``<script src>`` / ``<link href>`` is pointed at a
pinned local copy under ``_assets/`` (:data:`ASSETS`, from the npm packages :data:`ASSET_PACKAGES` that
``publish --install-assets`` installs, each checked against its SHA-256), ``integrity`` kept only where the
copy is the CDN's file (npm's flot 0.8.3 is unminified; stupidtable 1.0.1 is not on npm, 1.1.3 has the same API).
The staged site replaces the previous one in one step: a failed publish leaves it as it was.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mla_fp8_bench.harness import results as R

#: npm packages (pinned) that hold the files asv's pages load from CDNs.
ASSET_PACKAGES = ("jquery@3.3.1", "flot@0.8.3", "flot-orderbars@1.0.0", "stupid-table-plugin@1.1.3",
                  "blueimp-md5@2.19.0", "bootstrap@3.1.1")
#: Where the local copies go inside the published site.
SITE_ASSET_DIR = "_assets"
#: The file that marks a folder as a site this command wrote: only such a folder is ever replaced.
SITE_MARKER = ".mla-fp8-bench-site"
#: What a page loads from a CDN: (regex on the URL's end, its copy under ``node_modules/``, the copy's
#: SHA-256 in the pinned version).
ASSETS = (
    (r"/jquery-3\.3\.1\.min\.js$", "jquery/dist/jquery.min.js",
     "160a426ff2894252cd7cebbdd6d6b7da8fcd319c65b70468f10b6690c45d02ef"),
    (r"/flot/0\.8\.3/jquery\.flot\.min\.js$", "flot/jquery.flot.js",
     "b7b931f273c38b1277b9c6c1f4e05c4ec09885a487bddaf3279e2d7e49a38e12"),
    (r"/flot/0\.8\.3/jquery\.flot\.time\.min\.js$", "flot/jquery.flot.time.js",
     "a582c832adc7138a6b05aaf61f16ebac274701f1be4afea77e739a1c34b9c41a"),
    (r"/flot/0\.8\.3/jquery\.flot\.selection\.min\.js$", "flot/jquery.flot.selection.js",
     "e6c85f6c1ebe4b4da29d8ae238c7c5060283f05f7ef054f6b91817d02c092918"),
    (r"/flot/0\.8\.3/jquery\.flot\.categories\.min\.js$", "flot/jquery.flot.categories.js",
     "6e81664b28ea795c734906f4aa15614640a75ac7fbd399a7fb9084040698351a"),
    (r"/flot-orderbars@1\.0\.0/js/jquery\.flot\.orderBars\.js$", "flot-orderbars/js/jquery.flot.orderBars.js",
     "39735b4f46f96ff4e082572401f47c55a2767b366fd1d1e821e44a8d830a12bf"),
    (r"/stupidtable/1\.0\.1/stupidtable\.min\.js$", "stupid-table-plugin/stupidtable.min.js",
     "4642380f28ebe9ed7cac251793b281ef8620c4386205d92788f9b12f5cceb4e0"),
    (r"/blueimp-md5/2\.19\.0/js/md5\.min\.js$", "blueimp-md5/js/md5.min.js",
     "64d7ded388c562e4bde9e58ce205e5fa01b9734fcd434d496eb7b4fbfe9b927d"),
    (r"/bootstrap@3\.1\.1/dist/js/bootstrap\.min\.js$", "bootstrap/dist/js/bootstrap.min.js",
     "898d05a17f2cfc5120ddcdba47a885c378c0b466f30f0700e502757e24b403a1"),
    (r"/bootstrap@3\.1\.1/dist/css/bootstrap\.min\.css$", "bootstrap/dist/css/bootstrap.min.css",
     "e9503448692b738dd260fbd7f7cabf2e11f09b600fa97e6eb3a56eba5b1a7e9b"),
)
#: The fonts bootstrap's stylesheet refers to (copied along): file -> SHA-256.
_FONTS = {f"bootstrap/dist/fonts/glyphicons-halflings-regular.{ext}": digest for ext, digest in (
    ("eot", "f495f34e4f177cf0115af995bbbfeb3fcabc88502876e76fc51a4ab439bc8431"),
    ("svg", "d168d50a88c730b4e6830dc0da2a2b51dae4658a77d9619943c27b8ecfc19d1a"),
    ("ttf", "bd18efd3efd70fec8ad09611a20cdbf99440b2c1d40085c29be036f891d65358"),
    ("woff", "fc969dc1c6ff531abcf368089dcbaf5775133b0626ff56b52301a059fc0f9e1e"))}
_PINNED = {**{file: digest for _, file, digest in ASSETS}, **_FONTS}
INSTALL_COMMAND = "mla-fp8-bench publish --install-assets"

_TAG_RE = re.compile(r"<(script|link)\b[^>]*?\b(src|href)=[\"']((?:https?:)?//[^\"']+)[\"'][^>]*>", re.S | re.I)
_CSS_REMOTE_RE = re.compile(r"(?:@import\s+(?:url\()?|url\()\s*[\"']?((?:https?:)?//[^\"')\s]+)", re.I)


class PublishError(ValueError):
    """Publishing is refused or failed; the message names the problem (and the fix)."""


# ------------------------------------------------------------------------------------------ assets
def assets_dir() -> Path:
    """The default asset cache (``node_modules/`` inside; ``publish --assets DIR`` names another)."""
    return Path.home() / ".cache" / "mla-fp8-bench" / "site-assets"


def asset_problems(cache: Path | None = None) -> list[str]:
    """Files missing from the cache or differing from their pinned SHA-256 (``[]``: all present)."""
    nm = (cache or assets_dir()) / "node_modules"
    return [f"{rel} missing" if not (nm / rel).is_file() else f"{rel} is not the pinned version (sha256 differs)"
            for rel, digest in _PINNED.items()
            if not (nm / rel).is_file() or hashlib.sha256((nm / rel).read_bytes()).hexdigest() != digest]


def missing_assets_message(cache: Path, problems: list[str]) -> str:
    """One line: what is wrong with the cache and the one command that fixes it."""
    cmd = INSTALL_COMMAND if cache == assets_dir() else f"{INSTALL_COMMAND} --assets {cache}"
    return (f"site assets not usable in {cache} ({'; '.join(problems[:3])}"
            f"{f'; {len(problems) - 3} more' if len(problems) > 3 else ''}): install them once with "
            f"`{cmd}` (npm install of {' '.join(ASSET_PACKAGES)} into that folder)")


def install_assets(cache: Path | None = None, timeout: float = 300) -> Path:
    """``npm install`` the pinned packages into ``cache`` and check every file's SHA-256; PublishError: npm
    missing or failing, or a file that differs from its pinned hash."""
    cache = cache or assets_dir()
    npm = shutil.which("npm")
    if npm is None:
        raise PublishError("npm is not installed: install Node.js's npm (Debian: apt-get install -y npm), then run "
                           f"`{INSTALL_COMMAND}` again")
    cache.mkdir(parents=True, exist_ok=True)
    what = f"npm install of {' '.join(ASSET_PACKAGES)}"
    try:
        p = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--no-save", "--package-lock=false",
                            "--prefix", str(cache), *ASSET_PACKAGES], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise PublishError(f"{what} did not finish in {timeout:.0f} s") from None
    if p.returncode != 0:
        raise PublishError(f"{what} failed (exit {p.returncode}): {' '.join((p.stderr or p.stdout).split())[-400:]}")
    if problems := asset_problems(cache):
        raise PublishError(f"after npm install, {cache}: {'; '.join(problems)}")
    return cache


def drop_host_time_regressions(site: Path) -> int:
    """Remove CPU-machine latency steps from asv's Regressions page (JSON and Atom feed); returns how
    many rows were removed. A site without the files is left as it is."""
    import xml.etree.ElementTree as ET

    from mla_fp8_bench.measure.metric_table import find

    def host_time(row: list[Any]) -> bool:  # [name, graph, machine params, ...]: a latency track, no GPU
        m = find(str(row[0] if row else "").split("(", 1)[0].rsplit(".", 1)[-1])
        facts = row[2] if len(row) > 2 and isinstance(row[2], dict) else {}
        return m is not None and m.kind in ("kernel_latency", "host_latency") and R.is_cpu_machine(facts)

    path = site / "regressions.json"
    doc = json.loads(path.read_text()) if path.is_file() else None
    rows = doc.get("regressions", []) if isinstance(doc, dict) else []
    if not (dropped := [r for r in rows if host_time(r)]):
        return 0
    doc["regressions"] = [r for r in rows if r not in dropped]
    path.write_text(json.dumps(doc))
    feed = site / "regressions.xml"
    if feed.is_file():
        ns = "{http://www.w3.org/2005/Atom}"
        ET.register_namespace("", ns[1:-1])
        tree = ET.parse(feed)
        names = [str(r[0]) for r in dropped]
        for entry in list(tree.getroot().findall(f"{ns}entry")):
            title = entry.findtext(f"{ns}title") or ""
            if (hit := next((n for n in names if title.endswith(" " + n)), None)) is not None:
                names.remove(hit)
                tree.getroot().remove(entry)
        tree.write(feed, encoding="utf-8", xml_declaration=True)
    return len(dropped)


def _loads(m: re.Match) -> bool:
    """A remote tag matched by ``_TAG_RE`` that loads something: a script or a stylesheet link."""
    return m.group(1).lower() == "script" or bool(re.search(r"\brel=[\"']?stylesheet", m.group(0), re.I))


def vendorize(site: Path, cache: Path | None = None) -> list[dict[str, Any]]:
    """Copy the pinned files into the site's ``_assets/`` and point every remote ``<script src>`` / ``<link
    href>`` at its copy, keeping ``integrity`` where the copy matches; returns one entry per replaced tag.
    PublishError: a remote URL with no pinned copy (extend :data:`ASSETS`), a cached file not pinned."""
    nm = (cache or assets_dir()) / "node_modules"
    copies: dict[str, bytes] = {}
    for rel, digest in _PINNED.items():
        copies[rel] = data = (nm / rel).read_bytes()
        if hashlib.sha256(data).hexdigest() != digest:
            raise PublishError(f"site asset {nm / rel} is not the pinned version (sha256 differs): reinstall with "
                               f"`{INSTALL_COMMAND}`")
        (site / SITE_ASSET_DIR / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / SITE_ASSET_DIR / rel).write_bytes(data)
    out: list[dict[str, Any]] = []
    for page in sorted(site.rglob("*.html")):
        prefix = "" if page.parent == site else os.path.relpath(site, page.parent).replace(os.sep, "/") + "/"

        def repl(m: re.Match, page: Path = page, prefix: str = prefix) -> str:
            tag, url = m.group(0), m.group(3)
            file = next((f for tail, f, _ in ASSETS if re.search(tail, url)), None)
            if file is None:
                if not _loads(m):
                    return tag  # a plain link (e.g. rel=canonical) loads nothing
                raise PublishError(f"{page.name} loads {url} and no local copy is pinned for it: "
                                   "asv changed what its pages load (extend ASSETS in report/publish.py)")
            local = f"{prefix}{SITE_ASSET_DIR}/{file}"
            new = tag.replace(url, local)
            entry = {"page": page.name, "url": url, "local": local, "integrity": "none on the page"}
            # Subresource Integrity: "<algo>-<base64 digest>" tokens, one match suffices
            if integ := re.search(r"\bintegrity=[\"']([^\"']+)[\"']", tag):
                if any(base64.b64encode(hashlib.new(algo, copies[file]).digest()).decode() == want
                       for algo, _, want in (t.partition("-") for t in integ.group(1).split())
                       if algo in ("sha256", "sha384", "sha512")):
                    entry["integrity"] = "verified: the local copy is the CDN's file"
                else:
                    entry["integrity"] = "differs from the CDN's file (attribute dropped)"
                    new = new.replace(integ.group(0), "")
            out.append(entry)
            return new

        text = page.read_text()
        if (new_text := _TAG_RE.sub(repl, text)) != text:
            page.write_text(new_text)
    return out


def remote_references(site: Path) -> list[str]:
    """``"<file>: <url>"`` for every remote script or stylesheet a page or stylesheet of ``site`` loads."""
    out = []
    for f in sorted(site.rglob("*")):
        if f.suffix == ".html":
            out += [f"{f.relative_to(site)}: {m.group(3)}" for m in _TAG_RE.finditer(f.read_text(errors="replace"))
                    if _loads(m)]
        elif f.suffix == ".css":
            out += [f"{f.relative_to(site)}: {u}" for u in _CSS_REMOTE_RE.findall(f.read_text(errors="replace"))]
    return out


# ------------------------------------------------------------------------------------------ publishing
@dataclass
class PublishReport:
    """What :func:`publish_site` did."""

    html_dir: Path
    results_dir: Path
    wall_s: float
    asv_wall_s: float
    vendored: list[dict[str, Any]] = field(default_factory=list)


def _check_html_dir(html: Path, results: Path) -> None:
    """Refuse an ``--html-dir`` whose replacement could lose anything this command did not write
    (PublishError): a file; under a file; the results directory, inside it or holding it; a non-empty
    folder without :data:`SITE_MARKER`."""
    if html.exists() and not html.is_dir():
        raise PublishError(f"--html-dir {html} is a file, not a directory")
    anc = next((a for a in (html, *html.parents) if a.exists()), None)
    if anc is not None and not anc.is_dir():
        raise PublishError(f"--html-dir {html} lies under {anc}, which is a file")
    h, r = Path(os.path.realpath(html)), Path(os.path.realpath(results))
    if h == r or r in h.parents or h in r.parents:
        where = "is" if h == r else "lies inside" if r in h.parents else "holds"
        raise PublishError(f"--html-dir {html} {where} the results directory {results}: publishing replaces the "
                           "whole --html-dir folder; give a folder apart from the results")
    if html.is_dir() and any(html.iterdir()) and not (html / SITE_MARKER).is_file():
        what = "an asv site that mla-fp8-bench publish did not write" if (html / "index.html").is_file() else \
            "a non-empty folder that is not an asv site"
        raise PublishError(f"--html-dir {html} is {what} (no {SITE_MARKER} marker): publishing would replace its "
                           "contents; give an empty or new folder, or move it away yourself")


def _check_results(results: Path) -> None:
    """PublishError for no result files or naming the unreadable ones (asv publish skips them silently)."""
    try:
        mdirs = R.machine_dirs(results)
    except R.ResultsError as exc:
        raise PublishError(str(exc)) from None
    files = [f.path for m in mdirs for f in R.list_result_files(m)]
    if not files:
        raise PublishError(f"results directory {results} holds no asv result files: nothing to publish "
                           "(run `asv run` first)")
    checks = [(R.load_machine, m) for m in mdirs] + [(R.load_asv_result, f) for f in files]
    if (results / "benchmarks.json").exists():
        checks.append((R.load_benchmarks, results / "benchmarks.json"))
    bad = []
    for load, path in checks:
        try:
            load(path)
        except R.ResultsError as exc:
            bad.append(str(exc))
    if bad:
        raise PublishError(f"{len(bad)} file(s) of {results} cannot be read, and asv publish would leave their "
                           f"results out silently: {'; '.join(bad[:3])}{'; ...' if len(bad) > 3 else ''}")


def _run_asv_publish(conf: dict[str, Any], config_dir: Path, results: Path, site: Path, work: Path,
                     timeout: float) -> float:
    """``asv publish`` of ``results`` into ``site`` under a copy of ``conf`` (paths made absolute) written
    into ``work``; returns its wall time in seconds."""
    repo = conf.get("repo", ".")
    if "://" not in str(repo) and not str(repo).startswith("git@"):
        repo = str((config_dir / repo).resolve())
    conf = dict(conf, repo=repo, results_dir=str(results), html_dir=str(site), env_dir=str(work / "env"),
                benchmark_dir=str((config_dir / conf.get("benchmark_dir", "benchmarks")).resolve()))
    (work / "asv.conf.json").write_text(json.dumps(conf, indent=2))
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "asv", "publish", "--no-pull", "--config",
                               str(work / "asv.conf.json")], cwd=work, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise PublishError(f"asv publish did not finish in {timeout:.0f} s") from None
    if proc.returncode != 0 or not (site / "index.html").is_file():
        log = " ".join(((proc.stdout or "") + (proc.stderr or "")).split())
        raise PublishError(f"asv publish failed (exit {proc.returncode}): {log[-600:]}")
    return time.perf_counter() - t0


def publish_site(config: str | os.PathLike = "asv.conf.json", *, html_dir: str | os.PathLike | None = None,
                 results_dir: str | os.PathLike | None = None, assets: str | os.PathLike | None = None,
                 timeout: float = 900) -> PublishReport:
    """``asv publish`` of ``results_dir`` into ``html_dir`` (defaults: the ``config``'s, relative to its
    folder), made self-contained from the asset cache ``assets``; ``timeout``: seconds for ``asv publish``.

    Raises:
        PublishError: missing/corrupt assets (with the command that installs them), a bad config, html or
            results directory, a failing ``asv publish``, a remote reference left; the inputs are checked
            before ``asv publish``, and the previous site stays as it was on any failure.
    """
    from mla_fp8_bench.jsonio import OutputError, locked, umask_mode
    from mla_fp8_bench.report.results_merge import remove_tree, replace_dir
    from mla_fp8_bench.report.site_view import present

    t0 = time.perf_counter()
    for opt, val in (("--html-dir", html_dir), ("--results-dir", results_dir)):
        if val is not None and str(val).strip() == "":
            raise PublishError(f"{opt} '' is empty: give a folder, e.g. {opt[2:].split('-')[0]}")
    cache = Path(assets) if assets else assets_dir()
    if problems := asset_problems(cache):
        raise PublishError(missing_assets_message(cache, problems))
    cfg_path = Path(config)
    if not cfg_path.is_file():
        raise PublishError(f"asv config {cfg_path} does not exist")
    from asv import util

    try:  # asv's own loader: JSON with comments
        conf = util.load_json(str(cfg_path), js_comments=True)
    except Exception as exc:  # noqa: BLE001 - asv raises its own UserError / ValueError variants
        raise PublishError(f"asv config {cfg_path} cannot be read: {' '.join(str(exc).split())[:300]}") from None
    if not isinstance(conf, dict):
        raise PublishError(f"asv config {cfg_path} is not a JSON object")
    base = cfg_path.resolve().parent
    results = Path(results_dir) if results_dir else base / conf.get("results_dir", "results")
    html = (Path(html_dir) if html_dir else base / conf.get("html_dir", "html")).absolute()
    _check_html_dir(html, results)
    _check_results(results)
    try:
        with locked(html, "--html-dir"):
            _check_html_dir(html, results)  # again, under the lock: another publish may have written it
            try:
                html.parent.mkdir(parents=True, exist_ok=True)
                work = Path(tempfile.mkdtemp(prefix=f".{html.name}.publish-", dir=html.parent))
            except OSError as exc:
                raise PublishError(f"cannot write beside --html-dir {html}: {exc.strerror or exc}") from None
            try:
                site = work / "site"
                asv_wall = _run_asv_publish(conf, base, results.resolve(), site, work, timeout)
                vendored = vendorize(site, cache)
                drop_host_time_regressions(site)
                present(site)
                if left := remote_references(site):
                    raise PublishError(f"the published site still loads remote files: {'; '.join(left[:3])}")
                shutil.rmtree(work / "env", ignore_errors=True)
                try:
                    (site / SITE_MARKER).write_text("written by mla-fp8-bench publish; a folder with this file may "
                                                    "be replaced by the next publish\n")
                    os.chmod(site, umask_mode(0o777))
                    replace_dir(site, html)
                except OSError as exc:
                    raise PublishError(f"cannot put the site into {html}: {exc.strerror or exc}") from None
            finally:
                remove_tree(work)
    except OutputError as exc:
        raise PublishError(str(exc)) from None
    return PublishReport(html, results, round(time.perf_counter() - t0, 2), round(asv_wall, 2), vendored)


# ------------------------------------------------------------------------------------------ CLI
def add_parser(subparsers) -> None:
    """Register ``publish`` on the CLI's sub-parsers."""
    p = subparsers.add_parser(
        "publish", help="asv publish, self-contained: every script and stylesheet local (renders offline)")
    p.add_argument("--config", default="asv.conf.json", help="asv config (default asv.conf.json)")
    p.add_argument("--html-dir", default=None, help="output folder (default: the config's html_dir)")
    p.add_argument("--results-dir", default=None, help="asv results directory (default: the config's results_dir)")
    p.add_argument("--assets", default=None,
                   help="asset cache with node_modules/ (default ~/.cache/mla-fp8-bench/site-assets)")
    p.add_argument("--install-assets", action="store_true",
                   help=f"npm install the pinned asset packages ({' '.join(ASSET_PACKAGES)}) into the cache and exit")
    p.set_defaults(handler=cmd_publish)


def cmd_publish(args, console) -> int:
    """Handler of ``publish``: 0 on success; a :class:`PublishError` goes to the CLI (exit 2)."""
    from mla_fp8_bench.report.site_view import preview_hint

    if args.install_assets:
        cache = install_assets(Path(args.assets) if args.assets else None)
        console.print(f"site assets installed and checked in {cache}", highlight=False)
        return 0
    rep = publish_site(args.config, html_dir=args.html_dir, results_dir=args.results_dir, assets=args.assets)
    exact = sum(v["integrity"].startswith("verified") for v in rep.vendored)
    console.print(f"published {rep.results_dir} to {rep.html_dir} in {rep.wall_s:.1f} s (asv publish "
                  f"{rep.asv_wall_s:.1f} s); {len(rep.vendored)} CDN references made local "
                  f"({exact} byte-identical to the CDN's file, integrity kept)", highlight=False)
    console.print(preview_hint(rep.html_dir), highlight=False, markup=False, soft_wrap=True)
    return 0
