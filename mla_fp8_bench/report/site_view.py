"""What a person sees on the published asv site, and ``mla-fp8-bench preview`` to look at it.

:func:`present` rewrites a freshly published (staged) site; the stored results are never touched:

* ``track_latency`` graphs lose emulation backends' values (they have ``track_emulation_latency``);
* a benchmark with no finite value in any graph leaves the list; each thumbnail is drawn from one
  machine, a single point as a dot;
* the legend sits beside the graph, and one machine (the first with a GPU) is selected by default;
* regression factors from a floored 0 (asv stores 1e-12) read ``0 → 64 (new)``, others ``1.0502x``;
* opened as ``file://`` (browsers then refuse the data files) the pages say how to serve the site.

``mla-fp8-bench preview [--html-dir html] [--port 8080]`` serves it on 127.0.0.1 only.
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
from pathlib import Path
from typing import Any

from mla_fp8_bench.jsonio import finite_number
from mla_fp8_bench.measure.metric_table import ASV_ACCURACY_FLOOR, find

#: Host ``preview`` binds to: this machine only.
PREVIEW_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
_MARK = "mla-fp8-bench-site"


def preview_hint(html: Path, port: int = DEFAULT_PORT) -> str:
    """One line: the command that serves ``html`` and the address to open."""
    return (f"view it: mla-fp8-bench preview --html-dir {html} (serves http://{PREVIEW_HOST}:{port}/ on this "
            "machine only; opening index.html as a file cannot load its data)")


# ------------------------------------------------------------------------------------------ graphs
def _graph_files(site: Path, benchmark: str) -> list[Path]:
    return sorted(p for p in (site / "graphs").rglob(f"{benchmark}.json") if "summary" not in p.parts)


def drop_emulation_from_kernel_latency(site: Path) -> int:
    """Null emulation backends' values in the per-machine ``track_latency`` graphs; returns how many."""
    from mla_fp8_bench.harness.asv_support import emulation_backends

    lat = find("track_latency")
    index = json.loads((site / "index.json").read_text())
    bench = index.get("benchmarks", {}).get(lat.asv_name)
    if not bench or not bench.get("params"):
        return 0
    emu = {repr(b) for b in emulation_backends()}
    combos = list(itertools.product(*bench["params"]))
    drop = [i for i, c in enumerate(combos) if c and c[0] in emu]
    removed = 0
    for f in _graph_files(site, lat.asv_name):
        rows = json.loads(f.read_text())
        for row in rows:
            vals = row[1] if isinstance(row, list) and len(row) > 1 else None
            if isinstance(vals, list) and len(vals) == len(combos):
                removed += sum(vals[i] is not None for i in drop)
                for i in drop:
                    vals[i] = None
        rows = [r for r in rows if not (isinstance(r, list) and isinstance(r[1], list)
                                        and all(v is None for v in r[1]))]
        f.write_text(json.dumps(rows))
    return removed


def _finite(x: Any) -> bool:
    if isinstance(x, list):
        return any(_finite(v) for v in x)
    return finite_number(x) is not None


def drop_empty_benchmarks(site: Path) -> list[str]:
    """Remove from ``index.json`` the benchmarks with no finite value in any graph; returns their names."""
    path = site / "index.json"
    index = json.loads(path.read_text())
    empty = []
    for name in list(index.get("benchmarks", {})):
        if not any(_finite([row[1] for row in json.loads(p.read_text()) if isinstance(row, list) and len(row) > 1])
                   for p in (site / "graphs").rglob(f"{name}.json")):
            empty.append(name)
            del index["benchmarks"][name]
    if empty:
        path.write_text(json.dumps(index))
    return empty


def _point_value(v: Any) -> Any:
    """A graph row's value as one number: the geometric mean of a list's positive finite values; None if none."""
    if not isinstance(v, list):
        return v if _finite(v) else None
    xs = [float(x) for x in v if _finite(x) and x > 0]
    return statistics.geometric_mean(xs) if xs else None


def summaries_from_one_machine(site: Path) -> dict[str, str]:
    """Rewrite each thumbnail series (``graphs/summary/<name>.json``, geometric mean over params) from one
    machine, the first with a GPU that has data, else the first other (asv mixes all machines into one);
    returns benchmark -> the machine used."""
    index = json.loads((site / "index.json").read_text())
    machines = index.get("machines", {})  # with a GPU first, then the others, each group by name
    order = sorted(machines, key=lambda m: (str((machines[m] or {}).get("gpu", "none")) == "none", m))
    used: dict[str, str] = {}
    for name in index.get("benchmarks", {}):
        for machine in order:
            files = [p for p in _graph_files(site, name) if f"machine-{machine}" in p.parts]
            rows = [[row[0], v] for f in files for row in json.loads(f.read_text())
                    if isinstance(row, list) and len(row) > 1 and (v := _point_value(row[1])) is not None]
            if rows:
                (site / "graphs" / "summary" / f"{name}.json").write_text(json.dumps(sorted(rows)))
                used[name] = machine
                break
    return used


def _unpatched(f: Path) -> str | None:
    """The text of ``f``; None when it is missing or already rewritten."""
    text = f.read_text() if f.is_file() else _MARK
    return None if _MARK in text else text


def _patch_summary_grid(site: Path) -> bool:
    """Thumbnails of one or two points draw them as dots (a line needs two)."""
    f = site / "summarygrid.js"
    text = _unpatched(f)
    anchor = "                        shadowSize: 0\n"
    if text is None or text.count(anchor) != 1:
        return False
    f.write_text("/* " + _MARK + " */\n" + text.replace(
        anchor, "                        points: { show: data.length < 3, radius: 3 },\n" + anchor))
    return True


# ------------------------------------------------------------------------------------------ pages
_FILE_PAGE = """<div style="max-width:44em;margin:3em auto;font:16px/1.5 sans-serif">
<h1>This site has to be served over HTTP</h1>
<p>It was opened as a file (<code>file://</code>), and browsers do not let such a page read the data
files its graphs are drawn from.</p>
<p>Serve it on this machine and open the address it prints:</p>
<pre style="background:#f4f4f4;padding:.6em">mla-fp8-bench preview --html-dir SITE_DIR</pre>
<p>(<code>SITE_DIR</code> is the folder that holds this <code>index.html</code>; the server listens on
127.0.0.1 only. Any static web server of that folder works too.)</p></div>"""

_FILE_SCRIPT = ("<script>/* " + _MARK + ": file:// cannot load the site's data */\n"
                "if (location.protocol === 'file:') {{ if (window.jQuery) {{ jQuery.holdReady(true); }}\n"
                "  document.title = 'Serve this site over HTTP';\n"
                "  document.body.innerHTML = {page}; }}</script>\n")

#: flot draws the legend inside the plot; a column beside the graph keeps the data visible.
_LEGEND_CSS = ("<style>/* " + _MARK + " */ #graph > div:first-child {{ right: 17em !important; }}\n"
               "#mla-legend {{ position: absolute; top: 48px; right: 0; width: 16.5em; bottom: 100px;"
               " overflow-y: auto; font-size: 11px; }}</style>\n")

_FACTOR_JS = ("/* " + _MARK + ": factor text: a step from a floored 0 is new, not a ratio */\n"
              "function mlaFactorText(oldv, newv) {\n"
              "  if (!(oldv > " + repr(ASV_ACCURACY_FLOOR) + ")) {\n"
              "    return '0 \\u2192 ' + String(Number(Number(newv).toPrecision(4))) + ' (new)'; }\n"
              "  return (newv / oldv).toPrecision(5) + 'x';\n}\n"
              "function mlaValueText(v, unit) {\n"
              "  return v > " + repr(ASV_ACCURACY_FLOOR) + " ? $.asv.pretty_unit(v, unit) : '0';\n}\n")


def _patch_regressions_js(site: Path) -> bool:
    f = site / "regressions.js"
    if (text := _unpatched(f)) is None:
        return False
    new = text.replace("$('<td/>').text(factor.toFixed(2) + 'x')", "$('<td/>').text(mlaFactorText(revs[2], revs[3]))")
    new = new.replace("factor_td.text(factor.toFixed(2) + 'x');",
                      "factor_td.text(mlaFactorText(best_value, last_value));")
    for v in ("old_value", "new_value", "best_value", "last_value"):  # a floored 0 reads 0, not 1.00e-12
        new = new.replace(f"$.asv.pretty_unit({v}, benchmark.unit)", f"mlaValueText({v}, benchmark.unit)")
    if new == text:
        return False
    f.write_text(_FACTOR_JS + new)
    return True


_DEFAULT_MACHINE_JS = ("/* " + _MARK + ": one machine per graph by default (latencies of two machines are not"
                       " comparable): the first with a GPU that has data for the benchmark */\n"
                       "var MLA_DEFAULT_MACHINE = {defaults};\n"
                       "function mlaDefaultMachines(index, bench) {{\n"
                       "  if (bench && MLA_DEFAULT_MACHINE[bench]) {{ return [MLA_DEFAULT_MACHINE[bench]]; }}\n"
                       "  var names = index.params.machine.slice().sort();\n"
                       "  var gpu = names.filter(function (m) {{ var f = index.machines[m] || {{}};"
                       " return f.gpu && f.gpu !== 'none'; }});\n"
                       "  return [(gpu.length ? gpu : names)[0]];\n}}\n")
_PER_BENCHMARK = ("        /* " + _MARK + " */ if ((state_selection === null || !state_selection.machine)"
                  " && window.mlaLastBench !== current_benchmark) {\n"
                  "            state.machine = mlaDefaultMachines(index, current_benchmark); }\n"
                  "        window.mlaLastBench = current_benchmark;\n")


def _patch_graph_display(site: Path, defaults: dict[str, str]) -> bool:
    """flot's legend in a column beside the graph (``#mla-legend``); one machine selected by default per
    benchmark (``defaults``: benchmark -> machine; else the first with a GPU), the others one click away
    in the sidebar; a machine named in the page's address is kept."""
    f = site / "graphdisplay.js"
    text = _unpatched(f)
    rx = re.compile(r"legend:\s*\{\s*show:\s*show_legend,\s*position:\s*\"nw\",")
    default = "                state[param] = values;\n"
    anchor = "        /*\n          Benchmark-specific parameter selections"
    if text is None or not rx.search(text) or text.count(default) != 1 or text.count(anchor) != 1:
        return False
    container = ("legend: { show: show_legend, container: (function () {"
                 " var c = $('#mla-legend'); if (!c.length) { c = $('<div id=\"mla-legend\"/>');"
                 " $('#graph').append(c); } c.empty(); return c; })(),")
    text = rx.sub(lambda m: container, text, count=1)
    text = text.replace(default, "                state[param] = param === 'machine' ? "
                        "mlaDefaultMachines(index, current_benchmark) : values;\n")
    text = text.replace(anchor, _PER_BENCHMARK + anchor)
    f.write_text(_DEFAULT_MACHINE_JS.format(defaults=json.dumps(defaults, sort_keys=True)) + text)
    return True


def _patch_pages(site: Path) -> int:
    n = 0
    page = json.dumps(_FILE_PAGE)
    for f in sorted(site.glob("*.html")):
        if (text := _unpatched(f)) is None or "</body>" not in text:
            continue
        text = text.replace("</head>", _LEGEND_CSS.format() + "</head>", 1)
        text = text.replace("</body>", _FILE_SCRIPT.format(page=page) + "</body>", 1)
        f.write_text(text)
        n += 1
    return n


def present(site: Path) -> None:
    """Apply every rewrite of the module docstring to the published ``site``."""
    drop_emulation_from_kernel_latency(site)
    drop_empty_benchmarks(site)
    defaults = summaries_from_one_machine(site)
    _patch_summary_grid(site)
    _patch_regressions_js(site)
    _patch_graph_display(site, defaults)
    _patch_pages(site)


# ------------------------------------------------------------------------------------------ preview
def serve(html: Path, port: int = DEFAULT_PORT, echo=print) -> int:
    """Serve ``html`` on 127.0.0.1:``port`` until interrupted; returns the exit status. ValueError: no
    ``index.html`` in ``html``, or the port cannot be bound."""
    import functools
    import http.server

    if not (html / "index.html").is_file():
        raise ValueError(f"--html-dir {html} holds no published site (no index.html): run `mla-fp8-bench publish`")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(html))
    try:
        httpd = http.server.ThreadingHTTPServer((PREVIEW_HOST, port), handler)
    except OSError as exc:
        raise ValueError(f"--port {port} cannot be bound on {PREVIEW_HOST}: {exc.strerror or exc} "
                         "(choose another port, e.g. --port 0 for a free one)") from None
    with httpd:
        echo(f"serving {html} at http://{PREVIEW_HOST}:{httpd.server_address[1]}/ (this machine only; Ctrl-C stops)")
        try:
            httpd.serve_forever()
        except KeyboardInterrupt:
            echo("stopped")
    return 0


def cmd_preview(args, console) -> int:
    """Handler of ``preview``; a ``ValueError`` (no site, port taken) goes to the CLI (exit 2)."""
    return serve(Path(args.html_dir), args.port,
                 echo=lambda s: console.print(s, highlight=False, markup=False, soft_wrap=True))


def add_parser(subparsers) -> None:
    from mla_fp8_bench.argtypes import positive_int

    p = subparsers.add_parser("preview", help=f"serve the published site on {PREVIEW_HOST} (this machine only)")
    p.add_argument("--html-dir", default="html", help="the published site (default html)")
    p.add_argument("--port", type=lambda s: 0 if s == "0" else positive_int(s), default=DEFAULT_PORT,
                   help=f"TCP port (default {DEFAULT_PORT}; 0 picks a free one)")
    p.set_defaults(handler=cmd_preview)
