"""Navigation start → first chart drawn, on the demo study while it trains (issue 26's 1.5 s).

    python bench/first_chart.py [--repeats 5] [--min-steps 30] [--min-runs 4] [--port 18390]
    python bench/first_chart.py --server before=http://127.0.0.1:8001 \\
        --server after=http://127.0.0.1:8002 --token TOKEN   # two checkouts, one demo

The path a newcomer takes: ``conspo-lab serve --embedded --demo`` (what ``make run`` starts) in
a throwaway data directory, left to train until the running demo run has ``--min-steps``
steps and ``--min-runs`` runs have steps (so the grouped compare holds more than one run); then
Debian's Chromium (Playwright, headless) opens, interleaved,

* the run page of the run that is training, reached from the runs list (``/`` then the run),
* the compare page of the demo's runs that have steps, grouped by algorithm,
* the study page,

``--repeats`` times each, every load in a fresh browser context (an empty cache: a first visit).
With ``--server`` it measures servers already running instead (e.g. ``conspo-lab serve`` of two
checkouts on one data directory, one of them ``--embedded --demo``), interleaved: both sides
see the same data under the same load.

A page's figure is the time from its navigation start to the first animation frame after a
Plotly chart with a drawn trace (a path or image inside ``.js-plotly-plot .main-svg .trace``)
is in the page; beside it the page's main-thread busy time until then (Chromium's TaskDuration,
its CPU stand-in) and the server's CPU seconds over the load. Prints min / median per page and
the load average, which counts the demo's own training: the figures are under that load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import CHROMIUM, CHROMIUM_ARGS, stop  # noqa: E402

TARGET_S = 1.5

# Runs before any page script: notes the first frame after a chart with a drawn trace exists.
FIRST_CHART_PROBE = """
(() => {
  window.__firstChart = null;
  const long = (p) => (p.getAttribute("d") || "").length > 2;
  const traced = (t) => t.querySelector("image") || [...t.querySelectorAll("path")].some(long);
  const drawn = () =>
    [...document.querySelectorAll(".js-plotly-plot .main-svg .trace")].some(traced);
  const seen = new MutationObserver(() => {
    if (!drawn()) return;
    seen.disconnect();
    requestAnimationFrame(() => { window.__firstChart = performance.now(); });
  });
  const what = { childList: true, subtree: true, attributes: true, attributeFilter: ["d", "href"] };
  seen.observe(document, what);
})();
"""


def serve(data: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    root = str(Path(__file__).resolve().parent.parent)  # this checkout's code, not an install's
    env = {**os.environ, "CONSPO_DATA_DIR": str(data), "PYTHONPATH": root}
    for key in ("CONSPO_URL", "CONSPO_TOKEN", "CONSPO_DATABASE_URL", "CONSPO_BROKER_URL"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "conspo_lab.cli", "serve", "--embedded", "--demo"]
    cmd += ["--port", str(port)]
    return subprocess.Popen(
        cmd, cwd=data, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip


def wait_for_demo(
    http: httpx.Client, min_steps: int, min_runs: int, timeout: float
) -> dict[str, Any]:
    """The running demo run once it has ``min_steps`` steps and ``min_runs`` runs have steps."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            runs = http.get("/api/runs", params={"limit": 50}).json()["items"]
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            last = str(exc)
            time.sleep(1)
            continue
        running = [r for r in runs if r["status"] == "running" and (r["step"] or 0) >= min_steps]
        if running and sum(1 for r in runs if r["step"]) >= min_runs:
            return running[0]
        last = ", ".join(f"#{r['id']} {r['status']} {r['step']}" for r in runs[:6])
        time.sleep(2)
    raise SystemExit(
        f"the demo did not reach {min_steps} steps on a running run with {min_runs} runs "
        f"with steps in {timeout:.0f} s: {last}"
    )


def measure(
    browser: Any, url: str, before: str | None, server: psutil.Process | None
) -> dict[str, float]:
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    try:
        page = context.new_page()
        if before:  # the page a user comes from (its own load is not counted)
            page.goto(before, wait_until="load")
        page.add_init_script(FIRST_CHART_PROBE)
        cdp = context.new_cdp_session(page)
        cdp.send("Performance.enable")
        cpu0 = sum(server.cpu_times()[:2]) if server else float("nan")
        page.goto(url, wait_until="commit")
        page.wait_for_function("window.__firstChart !== null", timeout=60_000, polling=50)
        first = page.evaluate("window.__firstChart") / 1000
        cpu = sum(server.cpu_times()[:2]) - cpu0 if server else float("nan")
        metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
        return {
            "first_s": first,
            "busy_s": metrics.get("TaskDuration", float("nan")),
            "server_cpu_s": cpu,
        }
    finally:
        context.close()


def listening_process(url: str) -> psutil.Process | None:
    """The process serving ``url`` (its port on this machine), for its CPU time."""
    port = httpx.URL(url).port
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return psutil.Process(conn.pid)
    return None


def wait_healthy(base: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 180
    while True:
        try:
            if httpx.get(f"{base}/api/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit(log.read_text()[-3000:])
        time.sleep(0.5)


def pages_of(
    base: str, token: str, min_steps: int, min_runs: int, timeout: float
) -> dict[str, tuple[str, str | None]]:
    """Each page's URL and the page a user opens it from."""
    with httpx.Client(
        base_url=base, timeout=30, headers={"Authorization": f"Bearer {token}"}
    ) as http:
        run = wait_for_demo(http, min_steps, min_runs, timeout)
        study_id = http.get("/api/studies").json()["items"][0]["id"]
        runs = http.get("/api/runs", params={"limit": 50}).json()["items"]
    with_steps = ",".join(str(r["id"]) for r in sorted(runs, key=lambda r: r["id"]) if r["step"])
    print(f"{base}: run #{run['id']} training (step {run['step']}+), compare of runs {with_steps}")
    return {
        "run page": (f"{base}/runs/{run['id']}", f"{base}/"),
        "compare": (f"{base}/compare?runs={with_steps}&group=algorithm", None),
        "study": (f"{base}/studies/{study_id}", None),
    }


def report(results: dict[tuple[str, str], list[dict[str, float]]], loads: list[float]) -> None:
    head = f"{'server':<10} {'page':<10} {'first chart min / median (s)':>30}"
    print(f"{head} {'page busy median (s)':>22} {'server CPU median (s)':>23}")
    for (server, name), rows in results.items():
        firsts = [r["first_s"] for r in rows]
        cpu = [r["server_cpu_s"] for r in rows if r["server_cpu_s"] == r["server_cpu_s"]]
        print(
            f"{server:<10} {name:<10} {min(firsts):>17.2f} / {statistics.median(firsts):.2f}"
            f"{statistics.median(r['busy_s'] for r in rows):>23.2f}"
            f"{statistics.median(cpu) if cpu else float('nan'):>24.2f}"
            f"   {'ok' if statistics.median(firsts) <= TARGET_S else 'over'} (target {TARGET_S} s)"
        )
        print(f"{'':<21} each load (s): " + " ".join(f"{f:.2f}" for f in firsts))
    one, five, fifteen = os.getloadavg()
    print(
        f"load average during the loads: {min(loads):.2f}–{max(loads):.2f} (1 min); "
        f"now {one:.2f} {five:.2f} {fifteen:.2f}; {os.cpu_count()} CPUs"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--min-steps", type=int, default=30)
    parser.add_argument(
        "--min-runs", type=int, default=4,
        help="runs with steps before measuring: the grouped compare then holds both arms",
    )  # fmt: skip
    parser.add_argument("--port", type=int, default=18390)
    parser.add_argument("--timeout", type=float, default=900, help="seconds to wait for the demo")
    parser.add_argument(
        "--server", action="append", default=[], metavar="NAME=URL",
        help="measure running servers of one demo (say two checkouts on one data directory) "
        "instead of starting one; their pages interleaved",
    )  # fmt: skip
    parser.add_argument("--token", default=os.environ.get("CONSPO_TOKEN", ""), help="with --server")
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="conspo-first-chart-") as tmp:
        data = Path(tmp)
        proc = None
        servers = dict(s.split("=", 1) for s in args.server)
        token = args.token
        try:
            if not servers:
                proc = serve(data, args.port, data / "serve.log")
                servers = {"this": f"http://127.0.0.1:{args.port}"}
                wait_healthy(servers["this"], proc, data / "serve.log")
                token = (data / "token").read_text().strip()
            pages = {
                name: pages_of(url, token, args.min_steps, args.min_runs, args.timeout)
                for name, url in servers.items()
            }
            processes = {name: listening_process(url) for name, url in servers.items()}
            print(
                f"{args.repeats} loads of each page, interleaved, each in a fresh browser context"
            )
            results: dict[tuple[str, str], list[dict[str, float]]] = {
                (server, page): [] for server in servers for page in pages[server]
            }
            loads = []
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                for server in servers:  # warm each server's imports and caches
                    measure(browser, pages[server]["study"][0], None, processes[server])
                for _ in range(args.repeats):
                    for server, page in results:
                        url, before = pages[server][page]
                        results[server, page].append(
                            measure(browser, url, before, processes[server])
                        )
                        loads.append(os.getloadavg()[0])
                browser.close()
        finally:
            stop(proc, timeout=20)
    report(results, loads)


if __name__ == "__main__":
    main()
