"""``mla-fp8-bench publish``: ``asv publish`` into a staged folder, the site fixes of :mod:`.site_view`, then
the staged site put in place of the previous one in one step; a folder is replaced only when the previous
publish wrote everything in it (:data:`SITE_MARKER`). ``--offline`` points the pages' CDN scripts at pinned
local copies (npm packages ``--install-assets`` installs once, each checked against its SHA-256).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: The npm packages (pinned) holding the files asv's pages load from CDNs.
ASSET_PACKAGES = ("jquery@3.3.1", "flot@0.8.3", "flot-orderbars@1.0.0", "stupid-table-plugin@1.1.3",
                  "blueimp-md5@2.19.0", "bootstrap@3.1.1")
#: A CDN URL's end -> its copy under ``node_modules/`` (npm's flot 0.8.3 is unminified; stupidtable 1.0.1
#: is not on npm, 1.1.3 has its API).
CDN_COPIES = {
    r"/jquery-3\.3\.1\.min\.js": "jquery/dist/jquery.min.js",
    r"/flot/0\.8\.3/jquery\.flot\.min\.js": "flot/jquery.flot.js",
    r"/flot/0\.8\.3/jquery\.flot\.(time|selection|categories)\.min\.js": r"flot/jquery.flot.\1.js",
    r"/flot-orderbars@1\.0\.0/js/jquery\.flot\.orderBars\.js": "flot-orderbars/js/jquery.flot.orderBars.js",
    r"/stupidtable/1\.0\.1/stupidtable\.min\.js": "stupid-table-plugin/stupidtable.min.js",
    r"/blueimp-md5/2\.19\.0/js/md5\.min\.js": "blueimp-md5/js/md5.min.js",
    r"/bootstrap@3\.1\.1/dist/(js/bootstrap\.min\.js|css/bootstrap\.min\.css)": r"bootstrap/dist/\1"}
#: Every file copied into the site's ``_assets/`` (bootstrap's fonts too) -> its SHA-256.
PINNED = {
    "jquery/dist/jquery.min.js": "160a426ff2894252cd7cebbdd6d6b7da8fcd319c65b70468f10b6690c45d02ef",
    "flot/jquery.flot.js": "b7b931f273c38b1277b9c6c1f4e05c4ec09885a487bddaf3279e2d7e49a38e12",
    "flot/jquery.flot.time.js": "a582c832adc7138a6b05aaf61f16ebac274701f1be4afea77e739a1c34b9c41a",
    "flot/jquery.flot.selection.js": "e6c85f6c1ebe4b4da29d8ae238c7c5060283f05f7ef054f6b91817d02c092918",
    "flot/jquery.flot.categories.js": "6e81664b28ea795c734906f4aa15614640a75ac7fbd399a7fb9084040698351a",
    "flot-orderbars/js/jquery.flot.orderBars.js": "39735b4f46f96ff4e082572401f47c55a2767b366fd1d1e821e44a8d830a12bf",
    "stupid-table-plugin/stupidtable.min.js": "4642380f28ebe9ed7cac251793b281ef8620c4386205d92788f9b12f5cceb4e0",
    "blueimp-md5/js/md5.min.js": "64d7ded388c562e4bde9e58ce205e5fa01b9734fcd434d496eb7b4fbfe9b927d",
    "bootstrap/dist/js/bootstrap.min.js": "898d05a17f2cfc5120ddcdba47a885c378c0b466f30f0700e502757e24b403a1",
    "bootstrap/dist/css/bootstrap.min.css": "e9503448692b738dd260fbd7f7cabf2e11f09b600fa97e6eb3a56eba5b1a7e9b",
    **{f"bootstrap/dist/fonts/glyphicons-halflings-regular.{ext}": digest for ext, digest in (
        ("eot", "f495f34e4f177cf0115af995bbbfeb3fcabc88502876e76fc51a4ab439bc8431"),
        ("svg", "d168d50a88c730b4e6830dc0da2a2b51dae4658a77d9619943c27b8ecfc19d1a"),
        ("ttf", "bd18efd3efd70fec8ad09611a20cdbf99440b2c1d40085c29be036f891d65358"),
        ("woff", "fc969dc1c6ff531abcf368089dcbaf5775133b0626ff56b52301a059fc0f9e1e"))}}
#: The list of every path a publish wrote, kept in the site: only a folder with it is ever replaced.
SITE_MARKER = ".mla-fp8-bench-site"
_REMOTE_TAG = re.compile(r"<(?:script|link)\b[^>]*?\b(?:src|href)=\"((?:https?:)?//[^\"]+)\"[^>]*>", re.I)


class PublishError(ValueError):
    """Publishing is refused or failed; the message names the problem (and the fix)."""


def assets_dir() -> Path:  # where --install-assets puts the pinned copies (node_modules/ inside)
    return Path.home() / ".cache" / "mla-fp8-bench" / "site-assets"


def asset_problems() -> list[str]:  # the pinned files missing or differing from their SHA-256
    nm = assets_dir() / "node_modules"
    return [rel for rel, digest in PINNED.items()
            if not (nm / rel).is_file() or hashlib.sha256((nm / rel).read_bytes()).hexdigest() != digest]


def install_assets() -> Path:
    if (npm := shutil.which("npm")) is None:
        raise PublishError("--install-assets needs npm, which is not installed (Debian: apt-get install -y npm)")
    cmd = [npm, "install", "--no-audit", "--no-fund", "--no-save", "--package-lock=false", "--prefix"]
    if subprocess.run([*cmd, str(assets_dir()), *ASSET_PACKAGES]).returncode:
        raise PublishError(f"npm install of {' '.join(ASSET_PACKAGES)} into {assets_dir()} failed (see above)")
    if bad := asset_problems():
        raise PublishError(f"npm installed files that are not the pinned ones: {', '.join(bad)}")
    return assets_dir()


def vendorize(site: Path) -> None:
    """Copy the pinned files into ``site/_assets/`` and point every CDN script and stylesheet of the top
    pages at its copy, ``integrity`` dropped (the SHA-256 of :data:`PINNED` stands for it)."""
    for rel in PINNED:
        (site / "_assets" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(assets_dir() / "node_modules" / rel, site / "_assets" / rel)

    def local(m: re.Match) -> str:
        for tail, copy in CDN_COPIES.items():
            if hit := re.search(tail + "$", m[1]):
                tag = re.sub(r'\s(integrity|crossorigin|referrerpolicy)="[^"]*"', "", m[0])
                return tag.replace(m[1], "_assets/" + hit.expand(copy))
        raise PublishError(f"the site loads {m[1]}, which has no pinned copy (extend CDN_COPIES)")

    for page in site.glob("*.html"):
        page.write_text(_REMOTE_TAG.sub(local, page.read_text()))


def _written_by_publish(html: Path) -> None:
    """PublishError unless ``html`` is absent, empty, or holds only what the last publish wrote."""
    if html.exists() and not html.is_dir():
        raise PublishError(f"--html-dir {html} is a file, not a folder")
    marker = html / SITE_MARKER
    listed = set(marker.read_text().splitlines()[1:]) if marker.is_file() else set()
    extra = {str(p.relative_to(html)) for p in html.rglob("*")} - listed - {SITE_MARKER} if html.is_dir() else ()
    if top := sorted(e for e in extra if str(Path(e).parent) not in extra):
        raise PublishError(f"--html-dir {html} holds what publish did not write ({', '.join(top[:3])}"
                           f"{', ...' if len(top) > 3 else ''}): move that away, or publish to another --html-dir")


def _asv_publish(conf: dict, base: Path, results: Path, site: Path) -> list[str]:
    """``asv publish`` of ``results`` into ``site``; returns asv's lines about files it left out."""
    repo = str(conf.get("repo", "."))
    conf = dict(conf, repo=repo if re.match(r"\w+://|git@", repo) else str((base / repo).resolve()),
                results_dir=str(results.resolve()), html_dir=str(site), env_dir=str(site.parent / "env"),
                benchmark_dir=str((base / conf.get("benchmark_dir", "benchmarks")).resolve()))
    left_out = []
    if not re.match(r"\w+://|git@", repo):  # a branch this clone lacks: the site follows the checkout instead
        have = [b for b in conf.get("branches") or [] if subprocess.run(
            ["git", "-C", conf["repo"], "rev-parse", "--verify", "--quiet", f"refs/heads/{b}"],
            capture_output=True).returncode == 0]
        if conf.get("branches") and not have:
            left_out.append(f"branch {', '.join(conf['branches'])} is not in this clone: the graphs follow HEAD")
            conf["branches"] = ["HEAD"]
    (site.parent / "asv.conf.json").write_text(json.dumps(conf))
    p = subprocess.run([sys.executable, "-m", "asv", "publish", "--no-pull", "--config", "asv.conf.json"],
                       cwd=site.parent, capture_output=True, text=True)
    log = p.stdout + p.stderr
    if p.returncode != 0 or not (site / "index.html").is_file():
        raise PublishError(f"asv publish failed (exit {p.returncode}): {' '.join(log.split())[-600:]}")
    return left_out + list(dict.fromkeys(" ".join(s.split("··", 1)[1].split()) for s in log.splitlines() if "··" in s))


def publish_site(config: str | os.PathLike = "asv.conf.json", html_dir: str | os.PathLike | None = None,
                 results_dir: str | os.PathLike | None = None, offline: bool = False) -> tuple[Path, list[str]]:
    """``asv publish`` of ``results_dir`` into ``html_dir`` (defaults: the ``config``'s), opening on the kernel
    latencies; returns the site and asv's lines about files it left out. PublishError: nothing changed."""
    from asv import util

    from mla_fp8_bench.jsonio import locked
    from mla_fp8_bench.report.site_view import open_on_kernel_latency

    try:  # asv's own loader: JSON with comments
        conf = util.load_json(str(config), js_comments=True)
    except Exception as exc:  # noqa: BLE001 - asv raises its own UserError / ValueError variants
        raise PublishError(f"asv config {config} cannot be read: {' '.join(str(exc).split())[:300]}") from None
    base = Path(config).absolute().parent
    results = Path(base / conf.get("results_dir", "results") if results_dir is None else results_dir)
    html = Path(base / conf.get("html_dir", "html") if html_dir is None else html_dir).absolute()
    try:
        if not (results / "benchmarks.json").is_file():
            raise PublishError(f"--results-dir {results} holds no benchmarks.json: nothing to publish (run asv first)")
        if odd := [p for p in results.rglob("*") if not (p.is_file() or p.is_dir())]:  # asv would block on a FIFO
            raise PublishError(f"--results-dir {results} holds {odd[0]}, which is not a regular file: move it away")
        if offline and (missing := asset_problems()):
            raise PublishError(f"--offline needs the site's scripts in {assets_dir()} ({len(missing)} of "
                               f"{len(PINNED)} missing or changed): run `mla-fp8-bench publish --install-assets`")
        with locked(html, "--html-dir"):
            _written_by_publish(html)
            site = Path(tempfile.mkdtemp(prefix=".publish-", dir=html.parent)) / "site"
            try:
                left_out = _asv_publish(conf, base, results, site)
                open_on_kernel_latency(site)
                if offline:
                    vendorize(site)
                paths = sorted(str(p.relative_to(site)) for p in site.rglob("*"))
                (site / SITE_MARKER).write_text("\n".join(["written by mla-fp8-bench publish:", *paths]))
                if html.exists():
                    html.rename(site.parent / "previous")
                try:
                    site.rename(html)
                except OSError:
                    (site.parent / "previous").rename(html)
                    raise
            finally:
                shutil.rmtree(site.parent, ignore_errors=True)
    except OSError as exc:
        raise PublishError(f"cannot publish: {exc.strerror or exc}: {exc.filename or html}") from None
    return html, left_out


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("publish", help="asv publish into --html-dir, opening on a GPU's kernel latencies")
    p.add_argument("--config", default="asv.conf.json", help="asv config (default asv.conf.json)")
    p.add_argument("--html-dir", help="output folder (default: the config's html_dir)")
    p.add_argument("--results-dir", help="asv results directory (default: the config's results_dir)")
    p.add_argument("--offline", action="store_true", help="the site's scripts from pinned local copies, not CDNs")
    p.add_argument("--install-assets", action="store_true", help=f"npm install those copies ({assets_dir()}), exit")
    p.set_defaults(handler=cmd_publish)


def cmd_publish(args, console) -> int:
    if args.install_assets:
        console.print(f"site scripts installed and checked in {install_assets()}", highlight=False)
        return 0
    html, left_out = publish_site(args.config, args.html_dir, args.results_dir, args.offline)
    for line in left_out:
        console.print(f"asv publish: {line}", highlight=False, markup=False, soft_wrap=True)
    console.print(f"published {html}; view it: mla-fp8-bench preview --html-dir {html} (http://127.0.0.1:8080/)",
                  highlight=False, markup=False, soft_wrap=True)
    return 0
