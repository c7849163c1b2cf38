"""What the published site opens on, and ``mla-fp8-bench preview``, which serves it on 127.0.0.1 only."""

from __future__ import annotations

import argparse
import functools
import http.server
import itertools
import json
import math
from pathlib import Path
from urllib.parse import quote


def kernel_latency_view(site: Path) -> str | None:
    """The site address (after ``#``) of the kernel latency history on the GPU machine with the most such
    values at its newest commit, one line per backend, for the case most of them measured (the slowest)."""
    from mla_fp8_bench.measure.metric_table import find

    name = find("track_latency").asv_name
    index = json.loads((site / "index.json").read_text())
    if (bench := index["benchmarks"].get(name)) is None:
        return None
    best: tuple[int, str, dict] = (0, "", {})
    for f in site.glob(f"graphs/**/{name}.json"):
        machine = next((p[len("machine-"):] for p in f.parts if p.startswith("machine-")), "")
        if str((index["machines"].get(machine) or {}).get("gpu", "none")) != "none":
            rows = json.loads(f.read_text())
            last = rows[-1][1] if rows and isinstance(rows[-1][1], list) else []
            have = {c: v for c, v in zip(itertools.product(*bench["params"]), last)
                    if isinstance(v, (int, float)) and math.isfinite(v)}
            best = max(best, (len(have), machine, have), key=lambda t: t[:2])
    n, machine, have = best
    if not n:
        return None
    cases = {c[1]: [v for k, v in have.items() if k[1] == c[1]] for c in have}
    case = max(cases, key=lambda c: (len(cases[c]), sum(cases[c])))
    backend_name, case_name = bench["param_names"]
    shown = "".join(f"&p-{backend_name}={quote(b)}" for b in bench["params"][0] if (b, case) in have)
    return f"{name}?machine={quote(machine)}{shown}&p-{case_name}={quote(case)}"


def open_on_kernel_latency(site: Path) -> str | None:
    """Make ``site``'s index page open on :func:`kernel_latency_view` when its address names no page."""
    if (view := kernel_latency_view(site)) is not None:
        page = site / "index.html"
        script = f'<script>if (!location.hash) {{ history.replaceState(null, "", "#{view}"); }}</script>\n'
        page.write_text(page.read_text().replace("</head>", script + "</head>", 1))
    return view


def cmd_preview(args, console) -> int:
    """Serve ``--html-dir`` on 127.0.0.1 only (``asv preview`` binds every interface) until interrupted."""
    if not (Path(args.html_dir) / "index.html").is_file():
        raise ValueError(f"--html-dir {args.html_dir} holds no published site (no index.html): run "
                         "`mla-fp8-bench publish`")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=args.html_dir)
    try:
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), handler)
    except OSError as exc:
        raise ValueError(f"--port {args.port} cannot be bound on 127.0.0.1: {exc.strerror or exc}") from None
    with httpd:
        console.print(f"serving {args.html_dir} at http://127.0.0.1:{httpd.server_address[1]}/ (this machine "
                      "only; Ctrl-C stops)", highlight=False, markup=False, soft_wrap=True)
        try:
            httpd.serve_forever()
        except KeyboardInterrupt:
            pass
    return 0


def add_parser(subparsers) -> None:
    def port(text: str) -> int:
        if not text.isdigit() or int(text) > 65535:
            raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (0..65535)")
        return int(text)

    p = subparsers.add_parser("preview", help="serve the published site on 127.0.0.1 (this machine only)")
    p.add_argument("--html-dir", default="html", help="the published site (default html)")
    p.add_argument("--port", type=port, default=8080, help="TCP port (default 8080; 0: a free one)")
    p.set_defaults(handler=cmd_preview)
