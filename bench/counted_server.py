"""uvicorn with every SQL statement of the process counted, for the live-stream benches.

    python bench/counted_server.py COUNT_FILE [uvicorn arguments ...]

Statements are counted as they reach the database driver (SQLAlchemy ``before_cursor_execute``,
every engine of the process), split by who issued them: ``stream`` when the live streams' code
(``backend/api/stream_hub.py``, ``backend/api/routes/stream.py``) is on the calling stack, else
``other``. The totals so far are written to COUNT_FILE (JSON) every 0.25 s and at exit. One
process only: uvicorn's ``--workers`` children would not be counted.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn
from sqlalchemy import event
from sqlalchemy.engine import Engine

STREAM_CODE = (
    os.path.join("backend", "api", "stream_hub.py"),
    os.path.join("backend", "api", "routes", "stream.py"),
)

_counts = {"stream": 0, "other": 0}
_lock = threading.Lock()


@event.listens_for(Engine, "before_cursor_execute")
def _count(*_: Any) -> None:
    frame: FrameType | None = sys._getframe(1)
    who = "other"
    while frame is not None:
        if frame.f_code.co_filename.endswith(STREAM_CODE):
            who = "stream"
            break
        frame = frame.f_back
    with _lock:
        _counts[who] += 1


def _write(path: Path) -> None:
    with _lock:
        text = json.dumps(_counts)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _keep_writing(path: Path, stop: threading.Event) -> None:
    while not stop.wait(0.25):
        _write(path)


def read_counts(path: Path) -> dict[str, int]:
    """The totals the server last wrote (zeros before its first write)."""
    try:
        return {k: int(v) for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError):
        return {"stream": 0, "other": 0}


def main() -> None:
    path = Path(sys.argv[1])
    stop = threading.Event()
    threading.Thread(target=_keep_writing, args=(path, stop), daemon=True).start()
    atexit.register(_write, path)
    sys.argv = ["uvicorn", *sys.argv[2:]]
    uvicorn.main()


if __name__ == "__main__":
    main()
