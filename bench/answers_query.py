"""How long GET /api/answers takes at its bounds: N runs × P held-out problems (one stored
evaluation each), a page of 100 problems, on SQLite and PostgreSQL.

    PYTHONPATH=. .venv/bin/python bench/answers_query.py [--runs 50] [--problems 2000]
        [--repeats 5] [--dialects sqlite postgresql]

The rows are written as the worker writes them (``backend.storage.answers.write_answers``),
answers of 40 characters; each repeat asks the same page (show=all, then show=disagree) through
a TestClient, so the time is the app's (no network). Printed: every repeat's wall and CPU
seconds and their medians.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from backend.config import Settings  # noqa: E402
from backend.db import Database  # noqa: E402
from backend.migrate import migrate  # noqa: E402
from backend.models import Run  # noqa: E402
from backend.security import create_token  # noqa: E402
from backend.storage.answers import write_answers  # noqa: E402
from conspo.sink import AnswerRecord, prompt_key  # noqa: E402

PG = "postgresql+psycopg://postgres@127.0.0.1:5432"


def database(dialect: str, tmp: Path) -> str:
    if dialect == "sqlite":
        return f"sqlite:///{tmp / 'answers.db'}"
    import sqlalchemy as sa

    name = f"conspo_bench_{uuid.uuid4().hex[:8]}"
    engine = sa.create_engine(f"{PG}/postgres", isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return f"{PG}/{name}"


def fill(db: Database, runs: int, problems: int) -> list[int]:
    rng = random.Random(0)
    prompts = [f"{rng.randint(0, 9)}+{rng.randint(0, 9)}-{i}=" for i in range(problems)]
    ids = []
    with db.session() as session:
        for r in range(runs):
            run = Run(name=f"bench-{r}", task="arith", model="tiny", config={}, status="succeeded")
            session.add(run)
            session.flush()
            ids.append(run.id)
            answers = [
                AnswerRecord(
                    "held_out",
                    i,
                    prompt_key(p),
                    p,
                    "7",
                    "x" * 40,
                    rng.random() < 0.5,
                    -0.3,
                    4,
                    rng.randint(0, 4),
                )  # fmt: skip
                for i, p in enumerate(prompts)
            ]
            write_answers(session, run.id, {300: answers})
        session.commit()
    return ids


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--problems", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dialects", nargs="+", default=["sqlite", "postgresql"])
    args = ap.parse_args()
    from fastapi.testclient import TestClient

    from backend.main import create_app

    for dialect in args.dialects:
        with tempfile.TemporaryDirectory() as tmp:
            url = database(dialect, Path(tmp))
            migrate(url)
            settings = Settings(data_dir=Path(tmp), database_url=url, request_timeout_s=0)
            db = Database(settings)
            t0 = time.perf_counter()
            ids = fill(db, args.runs, args.problems)
            with db.session() as session:
                token = create_token(session, "bench")
            print(f"{dialect}: {args.runs} runs × {args.problems} problems written in "
                  f"{time.perf_counter() - t0:.1f} s")  # fmt: skip
            runs = ",".join(map(str, ids))
            with TestClient(create_app(settings)) as client:
                headers = {"Authorization": f"Bearer {token}"}
                for show in ("all", "disagree"):
                    walls, cpus = [], []
                    for _ in range(args.repeats):
                        w0, c0 = time.perf_counter(), time.process_time()
                        r = client.get(f"/api/answers?runs={runs}&show={show}&limit=100",
                                       headers=headers)  # fmt: skip
                        walls.append(time.perf_counter() - w0)
                        cpus.append(time.process_time() - c0)
                        assert r.status_code == 200, r.text[:300]
                    body = r.json()
                    print(f"  show={show}: {body['total']} problems matched, "
                          f"{len(body['pairs'])} pairs, {len(r.content) / 1e6:.2f} MB")  # fmt: skip
                    print("    wall s: " + " ".join(f"{w:.3f}" for w in walls)
                          + f"  median {statistics.median(walls):.3f}")  # fmt: skip
                    print("    cpu s:  " + " ".join(f"{c:.3f}" for c in cpus)
                          + f"  median {statistics.median(cpus):.3f}")  # fmt: skip
            db.dispose()


if __name__ == "__main__":
    main()
