"""A SmolLM2 run from the New run form, with the model's recommended settings, on a loaded box;
then cancels of more runs like it (issue 37's "done when").

    python bench/loaded_box.py [--steps 6] [--eval-every 3] [--burners 2] [--cancels 2]
    python bench/loaded_box.py --cancels-only      # the form's config, then only the cancels

What it does, in a throwaway data directory (the model store is ``CONSPO_MODEL_STORE`` if set,
so SmolLM2's ~40 s build can be shared):

1. starts ``conspo-lab serve --embedded`` (SQLite, the embedded worker: what ``make run`` runs)
   and ``--burners`` CPU benchmarks beside it (each a loop of 1024² float32 matmuls in torch,
   one thread each: together they want every core this box has, as a second job would);
2. opens the New run form in Chromium, types the model's name, checks the form applied the
   model's recommended settings (its note shown, 128 new tokens), sets ``--steps`` and
   ``--eval-every`` (the only two fields changed: the recommended 20 steps take ~20 min on
   an idle 2-core box, several times that loaded) and presses Start;
3. polls the run every second until it ends: the heartbeat's age (server time − heartbeat_at),
   attempts, worker deaths, each step's wall time; and counts the server log's watchdog lines;
4. submits ``--cancels`` runs of the same config one after the other and cancels each in a
   different phase (while its model loads / its first step samples; mid-step after step 1),
   timing the cancel (POST → status ``cancelled``) and checking the embedded worker is the
   same one after (its name and start time in /api/health, the server process alive).

Prints every reading and a verdict line per check. The figures are under the load it makes,
plus whatever else the box runs (its load average is printed).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import CHROMIUM, CHROMIUM_ARGS, stop  # noqa: E402

SMOLLM2 = "smollm2-135m-instruct"
WATCHDOG_LINE = re.compile(r"watchdog|no pulse|stalled|worker died|re-queued", re.IGNORECASE)


def burn(stop_at: float) -> None:
    """A CPU benchmark: 1024² float32 matmuls on one thread until ``stop_at``."""
    import torch

    torch.set_num_threads(1)
    a = torch.randn(1024, 1024)
    n = 0
    while time.time() < stop_at:
        a = torch.tanh(a @ a)
        n += 1
    print(f"burner {os.getpid()}: {n} matmuls", flush=True)


def serve(data: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    root = str(Path(__file__).resolve().parent.parent)  # this checkout's code
    env = {**os.environ, "CONSPO_DATA_DIR": str(data), "PYTHONPATH": root}
    for key in ("CONSPO_URL", "CONSPO_TOKEN", "CONSPO_DATABASE_URL", "CONSPO_BROKER_URL"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "conspo_lab.cli", "serve", "--embedded", "--port", str(port)]
    return subprocess.Popen(
        cmd, cwd=data, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip


def wait_healthy(base: str, proc: subprocess.Popen[bytes], log: Path) -> dict[str, Any]:
    deadline = time.monotonic() + 300
    while True:
        try:
            health = httpx.get(f"{base}/api/health", timeout=5).json()
            if health.get("workers"):
                return health["workers"][0]
        except (httpx.HTTPError, ValueError):
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit(log.read_text()[-3000:])
        time.sleep(0.5)


def submit_from_form(base: str, steps: int, eval_every: int) -> int:
    """The form as a person fills it: the model's name typed, its defaults checked, two fields
    changed, Start. Returns the new run's id."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
        )
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        page.goto(f"{base}/runs/new")
        page.fill('[name="config.name"]', "loaded-box smollm2")
        page.fill('[name="config.model.name"]', SMOLLM2)
        page.press('[name="config.model.name"]', "Tab")
        page.wait_for_selector("#model-note:visible", timeout=30_000)
        applied = {
            name: page.input_value(f'[name="config.{name}"]')
            for name in ("sampling.max_new_tokens", "sampling.group_size", "model.lora.rank")
        }
        print(f"form: {page.inner_text('#model-note')[:160]!r}")
        print(f"form: applied {applied}")
        assert applied["sampling.max_new_tokens"] == "128", applied
        page.fill('[name="config.steps"]', str(steps))
        page.click("summary:has-text('Advanced')")  # evaluation lives in the folded part
        page.fill('[name="config.eval.every"]', str(eval_every))
        page.wait_for_selector("#estimate:not([data-pending])", timeout=60_000)
        print(f"form: {page.inner_text('#estimate')}")
        page.click("#submit-btn")
        page.wait_for_url(re.compile(r"/runs/\d+$"), timeout=120_000)
        run_id = int(page.url.rsplit("/", 1)[1])
        browser.close()
    return run_id


def follow(http: httpx.Client, run_id: int, timeout: float) -> dict[str, Any]:
    """Polls the run each second until it ends; its heartbeat's oldest age, its steps' times."""
    deadline = time.monotonic() + timeout
    worst_age, steps_at, last_step = 0.0, {}, None
    run: dict[str, Any] = {}
    while time.monotonic() < deadline:
        response = http.get(f"/api/runs/{run_id}")
        now = float(response.headers.get("x-server-time", time.time()))
        run = response.json()
        if run["status"] == "running" and run["heartbeat_at"]:
            worst_age = max(worst_age, now - run["heartbeat_at"])
        if run["step"] != last_step:
            steps_at[run["step"]] = time.monotonic()
            last_step = run["step"]
            print(
                f"  run {run_id}: step {run['step']}/{run['total_steps']} {run['status']}"
                f" attempt {run['attempt']} deaths {run['worker_deaths']}"
                f" heartbeat oldest {worst_age:.1f} s  eta {run['eta_s']}",
                flush=True,
            )
        if run["status"] in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(1.0)
    marks = sorted(steps_at.items())
    step_s = [b[1] - a[1] for a, b in zip(marks, marks[1:], strict=False)]
    return {"run": run, "heartbeat_oldest_s": worst_age, "step_s": step_s}


def cancel_in(http: httpx.Client, config: dict[str, Any], phase: str, base: str) -> dict[str, Any]:
    """A run of ``config`` cancelled in ``phase``: 'start' (as soon as it runs: its model loads,
    its first rollouts sample) or 'mid-step' (8 s after its first step is stored)."""
    before = http.get("/api/health").json()["workers"][0]
    run = http.post("/api/runs", json={"config": {**config, "name": f"cancel {phase}"}}).json()
    run_id = run["runs"][0]["id"]
    deadline = time.monotonic() + 3600
    while time.monotonic() < deadline:
        now = http.get(f"/api/runs/{run_id}").json()
        if now["status"] == "running" and (phase == "start" or now["step"] >= 1):
            break
        time.sleep(0.5)
    time.sleep(2.0 if phase == "start" else 8.0)
    step_then = http.get(f"/api/runs/{run_id}").json()["step"]
    asked = time.monotonic()
    http.post(f"/api/runs/{run_id}/cancel")
    while time.monotonic() - asked < 120:
        now = http.get(f"/api/runs/{run_id}").json()
        if now["status"] != "running":
            break
        time.sleep(0.2)
    took = time.monotonic() - asked
    after = httpx.get(f"{base}/api/health", timeout=10).json()["workers"]
    same = any(
        w["name"] == before["name"] and w["started_at"] == before["started_at"] for w in after
    )
    return {
        "phase": phase, "run": run_id, "at_step": step_then, "status": now["status"],
        "seconds": took, "same_worker": same, "attempt": now["attempt"],
        "deaths": now["worker_deaths"],
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--eval-every", type=int, default=3)
    parser.add_argument("--burners", type=int, default=2)
    parser.add_argument("--cancels", type=int, default=2, choices=(0, 1, 2))
    parser.add_argument(
        "--cancels-only", action="store_true", help="the form's run cancelled, not followed"
    )
    parser.add_argument("--port", type=int, default=18420)
    parser.add_argument("--timeout", type=float, default=4 * 3600)
    args = parser.parse_args()

    data = Path(tempfile.mkdtemp(prefix="loaded-box-"))
    log = data / "serve.log"
    base = f"http://127.0.0.1:{args.port}"
    proc = serve(data, args.port, log)
    burners: list[Any] = []
    try:
        worker = wait_healthy(base, proc, log)
        print(f"server up: {base}, worker {worker['name']}; data {data}")
        token = (data / "token").read_text().strip()
        http = httpx.Client(base_url=base, timeout=60, headers={"Authorization": f"Bearer {token}"})
        stop_at = time.time() + args.timeout
        burners = [mp.Process(target=burn, args=(stop_at,)) for _ in range(args.burners)]
        for b in burners:
            b.start()
        print(f"{args.burners} CPU benchmarks started; load average {os.getloadavg()}")
        t0 = time.monotonic()
        run_id = submit_from_form(base, args.steps, args.eval_every)
        print(f"run {run_id} submitted from the form in {time.monotonic() - t0:.1f} s")
        if args.cancels_only:  # the form's run is the first one cancelled
            config = http.get(f"/api/runs/{run_id}").json()["config"]
            http.post(f"/api/runs/{run_id}/cancel")
            for phase in ("start", "mid-step"):
                result = cancel_in(http, config, phase, base)
                print(f"cancel: {result}")
                ok = result["status"] == "cancelled" and result["seconds"] <= 10
                ok = ok and result["same_worker"] and proc.poll() is None
                print(f"VERDICT cancel {phase}: {'PASS' if ok else 'FAIL'} (≤ 10 s, same worker)")
            return
        followed = follow(http, run_id, args.timeout)
        run = followed["run"]
        watchdog_lines = [ln for ln in log.read_text().splitlines() if WATCHDOG_LINE.search(ln)]
        steps = followed["step_s"]
        print(
            f"run {run_id}: {run['status']} at step {run['step']}/{run['total_steps']} in"
            f" {(run['finished_at'] or time.time()) - run['started_at']:.0f} s; attempt"
            f" {run['attempt']}, worker deaths {run['worker_deaths']}; heartbeat oldest"
            f" {followed['heartbeat_oldest_s']:.1f} s; step wall s (stored to stored):"
            f" {[round(s) for s in steps]} median {statistics.median(steps) if steps else 0:.0f};"
            f" eval/accuracy {run['summary'].get('eval/accuracy')}; load average"
            f" {os.getloadavg()}"
        )
        print(f"server log lines about the watchdog: {len(watchdog_lines)}")
        for line in watchdog_lines[:20]:
            print(f"  {line[:200]}")
        ok = run["status"] == "succeeded" and run["attempt"] == 1 and not run["worker_deaths"]
        print(f"VERDICT run: {'PASS' if ok else 'FAIL'} (succeeded, one attempt, no death)")
        config = run["config"]
        for phase in ("start", "mid-step")[: args.cancels]:
            result = cancel_in(http, config, phase, base)
            print(f"cancel: {result}")
            ok = result["status"] == "cancelled" and result["seconds"] <= 10
            ok = ok and result["same_worker"] and proc.poll() is None
            print(f"VERDICT cancel {phase}: {'PASS' if ok else 'FAIL'} (≤ 10 s, same worker)")
    finally:
        for b in burners:
            b.terminate()
        stop(proc, timeout=30)


if __name__ == "__main__":
    main()
