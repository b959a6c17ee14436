"""The demo study through the platform, then its answers problem by problem: which problems
each arm solves that GRPO does not (and back), McNemar's exact p per arm pooled over seeds, and
screenshots of the answers view and the study page's table for the README.

    PYTHONPATH=. .venv/bin/python bench/answers_demo.py [--seeds 0 1 2] [--arms grpo conspo]
        [--port 8765] [--data DIR] [--shots docs]

A real `conspo-lab serve --embedded` (SQLite, its own worker, one run at a time) in ``--data``
(default: a temporary directory) is given ``conspo_lab.cli_server.demo_spec()`` — the study
`make run` queues — with the arms and seeds asked (the full demo: 3 arms × 5 seeds, about 15 to
75 minutes here); every run trains 300 steps and evaluates its 256 held-out problems every 20.
Printed: each run's held-out accuracy at its last evaluation, and per arm against the baseline
the problems solved alone on each side, the (seed, problem) pairs and McNemar's p.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from conspo_lab.cli_server import demo_spec  # noqa: E402
from tests.support import CHROMIUM, CHROMIUM_ARGS  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--arms", nargs="+", default=["grpo", "conspo"])
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--shots", type=Path, default=None, help="write the screenshots here")
    ap.add_argument("--timeout-min", type=float, default=120)
    args = ap.parse_args()
    data = args.data or Path(tempfile.mkdtemp(prefix="answers-demo-"))
    env = {**os.environ, "CONSPO_DATA_DIR": str(data), "PYTHONPATH": str(ROOT)}
    data.mkdir(parents=True, exist_ok=True)
    log = (data / "serve.log").open("ab")
    cmd = [sys.executable, "-m", "conspo_lab.cli", "serve", "--embedded",
           "--host", "127.0.0.1", "--port", str(args.port)]  # fmt: skip
    server = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{args.port}"
    try:
        _wait(lambda: _up(url), 300, "the server")
        token = _wait(lambda: _token(data), 60, "data/token")
        http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60)
        spec = demo_spec()
        spec["arms"] = [a for a in spec["arms"] if a["name"] in args.arms]
        spec["seeds"] = args.seeds
        spec["concurrency"] = 1
        r = http.post("/api/studies", json=spec)
        r.raise_for_status()
        study = r.json()["id"]
        print(f"study {study}: {args.arms} × seeds {args.seeds} at {url}/studies/{study}")
        t0 = time.monotonic()

        def done() -> bool:
            view = http.get(f"/api/studies/{study}").json()
            counts = view["counts"]
            print(f"  {time.monotonic() - t0:6.0f} s: {counts}", flush=True)
            return view["status"] != "active" and not counts.get("running")

        _wait(done, args.timeout_min * 60, "the study", every=30)
        runs = http.get(f"/api/runs?group_id=study-{study}&limit=100").json()["items"]
        for run in sorted(runs, key=lambda r: r["id"]):
            got = http.get(f"/api/runs/{run['id']}/answers?text=false").json()
            solved = sum(a["solved"] for a in got["answers"])
            print(
                f"run {run['id']} {run['name']}: {run['status']}, {solved}/"
                f"{len(got['answers'])} held-out problems solved at step {got['step']}"
            )
        verdict = http.get(f"/api/studies/{study}/answers").json()
        for arm in verdict["arms"]:
            print(
                f"{arm['arm']} vs {verdict['baseline']}: solved alone {arm['solved_alone']},"
                f" {verdict['baseline']} alone {arm['baseline_alone']}, of {arm['shared']}"
                f" (seed, problem) pairs; McNemar p = {arm['mcnemar_p']:.3g}"
            )
            for s in arm["seeds"]:
                print(f"  seed {s['seed']}: {s['solved_alone']} alone vs {s['baseline_alone']}"
                      f" (runs {s['run']} and {s['baseline_run']})")  # fmt: skip
        if args.shots is not None and verdict["arms"] and verdict["arms"][0]["seeds"]:
            _screenshots(url, token, study, verdict, args.shots)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()


def _screenshots(url: str, token: str, study: int, verdict: dict, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    seed = verdict["arms"][0]["seeds"][0]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.goto(f"{url}/studies/{study}")
        page.wait_for_selector("#study-answers-table")
        page.locator("#study-answers").screenshot(path=str(out / "screenshot-study-answers.png"))
        runs = f"{seed['baseline_run']},{seed['run']}"
        page.goto(f"{url}/answers?runs={runs}&show=disagree")
        page.wait_for_selector("#ans-body tr.ans-row")
        page.click("#ans-body tr.ans-row >> nth=0")
        page.wait_for_selector("tr.ans-detail")
        page.screenshot(path=str(out / "screenshot-answers.png"))
        browser.close()
    print(f"screenshots: {out}/screenshot-study-answers.png, {out}/screenshot-answers.png")


def _up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/api/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _token(data: Path) -> str | None:
    path = data / "token"
    return path.read_text().strip() or None if path.is_file() else None


def _wait(check, seconds: float, what: str, every: float = 1.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise SystemExit(f"timed out after {seconds:.0f} s waiting for {what}")


if __name__ == "__main__":
    main()
