"""Python client for the ConSPO Lab REST API (docs/api.md), one typed method per endpoint.

    from conspo_lab.client import Client
    lab = Client("http://127.0.0.1:8000", token="...")   # or Client() to read CONSPO_URL/TOKEN
    sub = lab.create_runs({"algorithm": "grpo", "steps": 100}, seeds=[0, 1, 2], tags=["ablation"])
    for event in lab.watch(sub.runs[0].id):          # live SSE events until the run finishes
        print(event.event, event.data)

Errors come back as ``ApiError`` (status code plus the server's ``detail``); a 422 names the field
(``config.sampling.group_size: Input should be greater than or equal to 2``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import tarfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field

DEFAULT_URL = "http://127.0.0.1:8000"
MAX_POINTS_PER_LOG = 10_000  # the server's limit per POST /api/runs/{id}/log


def resolve_server(url: str | None = None, token: str | None = None) -> tuple[str, str | None]:
    """Server URL and token from the arguments, else CONSPO_URL / CONSPO_TOKEN, else defaults.

    The default token is the embedded server's token file, ``$CONSPO_DATA_DIR/token`` (default
    ``data/token`` under the working directory), when it exists, so a local
    ``conspo-lab serve --embedded`` needs no login step.
    """
    url = url or os.environ.get("CONSPO_URL") or DEFAULT_URL
    token = token or os.environ.get("CONSPO_TOKEN") or None
    token_file = Path(os.environ.get("CONSPO_DATA_DIR") or "data") / "token"
    if token is None and token_file.is_file():
        token = token_file.read_text().strip() or None
    return url.rstrip("/"), token


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


class ApiError(Exception):
    """A 4xx/5xx answer. ``detail`` is the server's ``detail`` (a string, or FastAPI's list of
    ``{"loc", "msg"}`` for a 422); ``field_errors`` flattens the latter to (field, message)."""

    def __init__(self, status: int, detail: Any, method: str = "", path: str = "") -> None:
        self.status = status
        self.detail = detail
        self.method = method
        self.path = path
        super().__init__(self._message())

    @property
    def field_errors(self) -> list[tuple[str, str]]:
        if not isinstance(self.detail, list):
            return []
        out = []
        for item in self.detail:
            if isinstance(item, Mapping):
                out.append((_field_name(item.get("loc", ())), str(item.get("msg", ""))))
            else:
                out.append(("", str(item)))
        return out

    def _message(self) -> str:
        where = f"{self.method} {self.path}: " if self.method else ""
        if self.field_errors:
            text = "; ".join(f"{f}: {m}" if f else m for f, m in self.field_errors)
        else:
            text = str(self.detail)
        return f"{where}HTTP {self.status}: {text}"


class ServerUnavailable(ApiError):
    """The server could not be reached (connection refused, timeout); ``status`` is 0."""


class ChecksumMismatch(ApiError):
    """A downloaded model's tar is not the one the server hashed (``status`` is 0); its partial
    file has been deleted, so the next download starts over."""


def _field_name(loc: Sequence[Any]) -> str:
    # FastAPI prefixes request-body errors with "body"; the field path is what a user edits.
    parts = [str(p) for p in loc]
    if parts and parts[0] in {"body", "query", "path"}:
        parts = parts[1:]
    return ".".join(parts)


# --------------------------------------------------------------------------------------------
# Response models (extra fields allowed, so a newer server does not break an older client)
# --------------------------------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class Run(_Model):
    id: int
    name: str | None = None
    owner: str | None = None
    status: str
    cancel_requested: bool = False
    kind: str | None = None  # what it trains: a registered job kind (presets().kinds)
    algorithm: str | None = None  # None for a kind that trains none
    label: str | None = None  # both, for people: "rl · grpo", "sft"
    task: str | None = None
    model: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    seed: int | None = None
    group_id: str | None = None
    tags: list[str] = Field(default_factory=list)
    step: int = 0
    total_steps: int | None = None
    created_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    heartbeat_at: float | None = None
    worker_host: str | None = None
    device: str | None = None
    error: str | None = None
    summary: dict[str, float | None] = Field(default_factory=dict)
    external: bool = False
    queue_position: int | None = None  # queued: 1 for the next to start
    waiting_reason: str | None = None  # queued: why no worker has taken it yet
    resources_text: str | None = None  # "1 GPU", "1 CPU process"
    attempt: int = 0  # attempts so far: above 1, it was handed back or its worker died
    worker_deaths: int = 0  # attempts whose worker died (killed, out of memory, stalled)
    last_worker_death: str | None = None
    resumed_from_step: int | None = None  # the latest attempt's checkpoint step
    pace_s: float | None = None  # seconds per step lately
    eta_s: float | None = None  # seconds left at that pace, as of the response
    phase: str | None = None  # running: "training" or "evaluating"; None while setting up

    @property
    def status_text(self) -> str:
        """ "running (evaluating)": the status with what a running run is doing between steps,
        as its page says it (an evaluation may take minutes with no step logged, a set-up too).
        An external run reports no phase: its status alone."""
        if self.status != "running":
            return self.status
        doing = self.phase or (None if self.external else "setting up")
        return f"running ({doing})" if doing else "running"

    @property
    def finished(self) -> bool:
        return self.status in FINISHED_STATUSES

    @property
    def attempts_text(self) -> str | None:
        """ "attempt 2 · 1 worker death · resumed from step 5", or None for a first attempt
        with no death (the run page says the same)."""
        if self.attempt <= 1 and not self.worker_deaths:
            return None
        parts = [f"attempt {self.attempt}"]
        if self.worker_deaths:
            deaths = self.worker_deaths
            parts.append(f"{deaths} worker death{'s' if deaths != 1 else ''}")
        if self.resumed_from_step is not None:
            parts.append(
                f"resumed from step {self.resumed_from_step}"
                if self.resumed_from_step
                else "started over (no checkpoint)"
            )
        return " · ".join(parts)


FINISHED_STATUSES = frozenset({"succeeded", "failed", "cancelled"})


class Submission(_Model):
    group_id: str | None = None
    runs: list[Run]


class RunPage(_Model):
    items: list[Run]
    total: int


class Series(_Model):
    steps: list[int] = Field(default_factory=list)
    values: list[float | None] = Field(default_factory=list)
    min: list[float | None] = Field(default_factory=list)
    max: list[float | None] = Field(default_factory=list)
    wall_time: list[float | None] = Field(default_factory=list)
    sampled: bool = False
    total_points: int = 0


class RolloutRow(_Model):
    step: int
    group: int
    index: int
    reward: float | None = None
    score: float | None = None
    length: int | None = None
    truncated: bool | None = None


class RegisteredPreset(_Model):
    """A registered entry (an algorithm, a task, a job kind, a reward): its parameters' JSON
    schema and their defaults."""

    name: str
    description: str = ""
    params_schema: dict[str, Any] = Field(default_factory=dict)
    defaults: dict[str, Any] = Field(default_factory=dict)


class KindPreset(RegisteredPreset):
    """A job kind (config.kind); ``sections``: the config sections only some kinds train with
    that this one does."""

    sections: list[str] = Field(default_factory=list)


class RewardPreset(RegisteredPreset):
    """A reward function (config.rewards[].name): its weight when the config gives none, and
    the tasks a run may have it with."""

    default_weight: float = 1.0
    tasks: list[str] = Field(default_factory=list)


class NamedPreset(_Model):
    name: str
    description: str = ""


class ToolPreset(NamedPreset):
    """A tool a rollout may call (config.tools.names): the model calls it by writing
    ``<tag>…</tag>``; ``sandboxed``: it runs model-written code, so it needs a worker with a
    sandbox."""

    tag: str = ""
    sandboxed: bool = False


class Presets(_Model):
    """What the server's registries hold (GET /api/presets): every name comes from there."""

    kinds: list[KindPreset] = Field(default_factory=list)
    algorithms: list[RegisteredPreset] = Field(default_factory=list)
    tasks: list[RegisteredPreset] = Field(default_factory=list)
    environments: list[RegisteredPreset] = Field(default_factory=list)  # task environment plays
    rewards: list[RewardPreset] = Field(default_factory=list)
    models: list[NamedPreset] = Field(default_factory=list)
    tools: list[ToolPreset] = Field(default_factory=list)
    config_schema: dict[str, Any] = Field(default_factory=dict)
    defaults: dict[str, Any] = Field(default_factory=dict)


class Health(_Model):
    status: str
    database: str | None = None
    broker: str | None = None
    mode: str | None = None
    version: str | None = None


@dataclass(frozen=True)
class StreamEvent:
    """One Server-Sent Event: ``event`` is metrics, status or end; ``data`` is the parsed JSON
    (``status`` events' data is also available as ``run``)."""

    event: str
    data: Any
    id: str | None = None

    @property
    def run(self) -> Run | None:
        if self.event == "status" and isinstance(self.data, Mapping):
            return Run.model_validate(self.data)
        return None


# --------------------------------------------------------------------------------------------
# The client
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelDownload:
    """What ``Client.fetch_model`` downloaded."""

    path: Path  # the unpacked model directory: from_pretrained(path)
    sha256: str  # the tar's SHA-256 (hex), the server's, which its bytes were checked against
    size: int  # the tar's bytes
    resumes: int  # requests that went on from a partial file with a Range


class Client:
    """Typed access to every endpoint of docs/api.md. Usable as a context manager."""

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url, self.token = resolve_server(base_url, token)
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self._http = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=timeout, transport=transport
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- plumbing ---------------------------------------------------------------------------

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        if "json" in kwargs:
            # Standard JSON has no NaN/Infinity: send them as null (the server stores null).
            kwargs["content"] = json.dumps(_finite(kwargs.pop("json")), allow_nan=False)
            kwargs.setdefault("headers", {})["Content-Type"] = "application/json"
        if "params" in kwargs:
            kwargs["params"] = {k: v for k, v in kwargs["params"].items() if v is not None}
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ServerUnavailable(
                0, f"cannot reach {self.base_url}: {exc}", method, path
            ) from exc
        if response.status_code >= 400:
            raise ApiError(response.status_code, _detail(response), method, path)
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    # --- runs -------------------------------------------------------------------------------

    def create_runs(
        self,
        config: BaseModel | Mapping[str, Any],
        seeds: Sequence[int] | None = None,
        tags: Sequence[str] = (),
        name: str | None = None,
    ) -> Submission:
        """Queue one run per seed (the server replaces config.seed); ``group_id`` joins them."""
        body = {
            "config": _as_dict(config),
            "seeds": list(seeds) if seeds is not None else None,
            "tags": list(tags),
            "name": name,
        }
        return Submission.model_validate(self._request("POST", "/api/runs", json=body))

    def list_runs(
        self,
        status: str | None = None,
        algorithm: str | None = None,
        task: str | None = None,
        tag: str | None = None,
        kind: str | None = None,
        group_id: str | None = None,
        q: str | None = None,
        sort: str | None = None,
        limit: int = 50,
        offset: int = 0,
        ids: list[int] | None = None,
        where: str | None = None,
        order_by: str | None = None,
    ) -> RunPage:
        """Runs matching every filter given; ``where``: conditions on config fields and metric
        summaries (``params.tau>=5 AND best(eval/accuracy)>0.2``, docs/api.md)."""
        params = dict(
            status=status,
            kind=kind,
            algorithm=algorithm,
            task=task,
            tag=tag,
            group_id=group_id,
            ids=None if ids is None else ",".join(str(i) for i in ids),
            q=q,
            where=where,
            order_by=order_by,
            sort=sort,
            limit=limit,
            offset=offset,
        )
        return RunPage.model_validate(self._request("GET", "/api/runs", params=params))

    def get_run(self, run_id: int) -> Run:
        return Run.model_validate(self._request("GET", f"/api/runs/{run_id}"))

    def cancel(self, run_id: int) -> Run:
        return Run.model_validate(self._request("POST", f"/api/runs/{run_id}/cancel"))

    def delete(self, run_id: int) -> None:
        self._request("DELETE", f"/api/runs/{run_id}")

    def clone(
        self,
        run_id: int,
        overrides: Mapping[str, Any] | None = None,
        seeds: Sequence[int] | None = None,
        tags: Sequence[str] | None = None,
        name: str | None = None,
    ) -> Submission:
        """Queue copies of a run with ``overrides`` deep-merged into its config."""
        body = {
            "overrides": dict(overrides or {}),
            "seeds": list(seeds) if seeds is not None else None,
            "tags": list(tags) if tags is not None else None,
            "name": name,
        }
        data = self._request("POST", f"/api/runs/{run_id}/clone", json=body)
        return Submission.model_validate(data)

    # --- external runs (a trainer elsewhere logs into the lab) --------------------------------

    def create_external_run(
        self,
        name: str,
        config: Mapping[str, Any] | None = None,
        algorithm: str = "external",
        task: str = "external",
        model: str = "external",
        tags: Sequence[str] = (),
        total_steps: int | None = None,
    ) -> Run:
        body = {
            "name": name,
            "config": _as_dict(config or {}),
            "algorithm": algorithm,
            "task": task,
            "model": model,
            "tags": list(tags),
            "total_steps": total_steps,
        }
        return Run.model_validate(self._request("POST", "/api/runs/external", json=body))

    def log_steps(
        self,
        run_id: int,
        steps: Iterable[Mapping[str, Any]] = (),
        rollouts: Sequence[Mapping[str, Any]] = (),
        status: str | None = None,
        error: str | None = None,
    ) -> int:
        """Write ``[{"step", "metrics": {key: float}, "wall_time"}]`` (idempotent per step/key).

        Splits into calls of at most 10,000 points; ``status``/``error`` go with the last call,
        so a final ``status="succeeded"`` lands after every point. Returns the points written.
        """
        chunks = _chunk_steps([dict(s) for s in steps], MAX_POINTS_PER_LOG) or [[]]
        written = 0
        for i, chunk in enumerate(chunks):
            last = i == len(chunks) - 1
            body: dict[str, Any] = {"steps": chunk, "rollouts": list(rollouts) if last else []}
            if last:
                body.update(status=status, error=error)
            data = self._request("POST", f"/api/runs/{run_id}/log", json=body)
            written += int((data or {}).get("written", 0))
        return written

    # --- metrics ----------------------------------------------------------------------------

    def metric_keys(self, run_id: int) -> list[str]:
        return list(self._request("GET", f"/api/runs/{run_id}/metrics/keys")["keys"])

    def metrics(
        self,
        run_id: int,
        keys: Sequence[str],
        max_points: int = 1000,
        since_step: int | None = None,
        x: str | None = None,
        step_max: int | None = None,
    ) -> dict[str, Series]:
        """Series per key with steps in (``since_step``, ``step_max``]; when a series has more
        than ``max_points`` points there it is bucketed (each bucket: last step, mean, min,
        max) and ``Series.sampled`` is true. ``iter_points`` pages through raw points."""
        params = dict(
            keys=",".join(keys), max_points=max_points, since_step=since_step, x=x,
            step_max=step_max,
        )  # fmt: skip
        data = self._request("GET", f"/api/runs/{run_id}/metrics", params=params)
        return {k: Series.model_validate(v) for k, v in data["series"].items()}

    def iter_points(
        self, run_id: int, keys: Sequence[str], page_points: int = 10_000
    ) -> Iterator[dict[str, Series]]:
        """Every raw point of ``keys`` up to the run's last step, in pages, never bucketed.

        Pages are step ranges (``since_step`` exclusive, ``step_max`` inclusive) read with
        ``max_points=page_points``. A range of ``page_points`` steps cannot hold more points
        per key, so it is never bucketed; sparse series (eval every 100 steps) get wider
        ranges, and a range that comes back bucketed is read again at half the width.
        """
        if not keys:
            return
        last = self.get_run(run_id).step
        cursor, width = -1, page_points
        while cursor < last:
            page = self.metrics(
                run_id, keys, max_points=page_points, since_step=cursor,
                step_max=min(cursor + width, last),
            )  # fmt: skip
            if any(s.sampled for s in page.values()):
                width = max(page_points, width // 2)
                continue
            yield page
            cursor = min(cursor + width, last)
            if max((len(s.steps) for s in page.values()), default=0) < page_points // 4:
                width *= 2
            if cursor >= last:  # the run may have moved on meanwhile (its step only grows)
                last = self.get_run(run_id).step

    def compare(
        self, runs: Sequence[int], keys: Sequence[str], max_points: int = 1000
    ) -> dict[int, dict[str, Series]]:
        params = dict(
            runs=",".join(str(r) for r in runs), keys=",".join(keys), max_points=max_points
        )
        data = self._request("GET", "/api/compare", params=params)
        return {
            int(run_id): {k: Series.model_validate(v) for k, v in entry["series"].items()}
            for run_id, entry in data["runs"].items()
        }

    def rollouts(
        self,
        run_id: int,
        step_min: int | None = None,
        step_max: int | None = None,
        limit: int | None = None,
    ) -> list[RolloutRow]:
        params = dict(step_min=step_min, step_max=step_max, limit=limit)
        data = self._request("GET", f"/api/runs/{run_id}/rollouts", params=params)
        return [RolloutRow.model_validate(r) for r in data["items"]]

    # --- presets and health -----------------------------------------------------------------

    # --- studies (GET /api/studies/{id} answers a dict: docs/studies.md says what it holds) --

    def create_study(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Submit a study (arms × seeds, or a search); its first runs are queued at once."""
        return dict(self._request("POST", "/api/studies", json=dict(spec)))

    def check_study(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Every check ``create_study`` makes, nothing stored: the runs it would plan
        (``{arms, tasks, seeds, runs, baseline}``), or the 422 naming each bad field."""
        return dict(self._request("POST", "/api/studies/check", json=dict(spec)))

    def get_study(self, study_id: int, curves: bool = False) -> dict[str, Any]:
        """Arms, runs, objective per run, statistics and the verdict lines."""
        params = {"curves": str(curves).lower()}
        return dict(self._request("GET", f"/api/studies/{study_id}", params=params))

    def list_studies(self, limit: int = 50, offset: int = 0) -> dict[str, Any]:
        params = {"limit": limit, "offset": offset}
        return dict(self._request("GET", "/api/studies", params=params))

    def cancel_study(self, study_id: int) -> dict[str, Any]:
        return dict(self._request("POST", f"/api/studies/{study_id}/cancel"))

    def study_report(self, study_id: int) -> str:
        """The study as one self-contained HTML file."""
        return self._text("GET", f"/api/studies/{study_id}/report.html")

    def study_objective_csv(self, study_id: int) -> str:
        return self._text("GET", f"/api/studies/{study_id}/objective.csv")

    def compare_report(
        self,
        runs: Sequence[int],
        key: str = "eval/accuracy",
        *,
        group: str = "",
        baseline: str | None = None,
        k: int = 3,
        direction: str = "max",
        csv: bool = False,
    ) -> str:
        """The runs grouped by ``group`` (a config path or algorithm/task/model) as one
        self-contained HTML report, each group against ``baseline`` (a label such as
        ``algorithm=grpo``; default the first group); ``csv``: each run's mean of its last ``k``
        values of ``key`` instead."""
        params = dict(
            runs=",".join(str(r) for r in runs),
            key=key,
            group=group,
            k=k,
            direction=direction,
            **({"baseline": baseline} if baseline else {}),
        )
        path = "/api/compare/objective.csv" if csv else "/api/compare/report.html"
        return self._text("GET", path, params=params)

    # --- pipelines and the model registry (dicts: docs/api.md says what they hold) -----------

    def create_pipeline(
        self, name: str, stages: Sequence[Mapping[str, Any]], tags: Sequence[str] = ()
    ) -> dict[str, Any]:
        """Submit stage configs as one pipeline: stage 0 is queued at once, each later stage
        when the one before succeeds, starting from its checkpoint (``model.step``)."""
        body = {"name": name, "stages": [dict(s) for s in stages], "tags": list(tags)}
        return dict(self._request("POST", "/api/pipelines", json=body))

    def get_pipeline(self, pipeline_id: int) -> dict[str, Any]:
        """Stages in order: each one's run, the checkpoint it started from, its first and last
        held-out evaluation."""
        return dict(self._request("GET", f"/api/pipelines/{pipeline_id}"))

    def cancel_pipeline(self, pipeline_id: int) -> dict[str, Any]:
        """Cancel the current stage's run; the later stages never run."""
        return dict(self._request("POST", f"/api/pipelines/{pipeline_id}/cancel"))

    # --- alerts and answers -------------------------------------------------------------------

    def create_alert(
        self,
        event: str,
        webhook: str,
        *,
        run_id: int | None = None,
        study_id: int | None = None,
        metric: str | None = None,
        comparison: str | None = None,
        threshold: float | None = None,
        stall_minutes: float | None = None,
        format: str = "slack",
        name: str = "",
    ) -> dict[str, Any]:
        """An alert rule (``POST /api/alerts``): ``event`` failed, finished, stalled or metric,
        told to ``webhook`` (Slack, Discord or JSON ``format``); the scope is ``run_id``, else
        ``study_id``, else every run of yours. The answer shows the webhook's host only."""
        body = {
            "event": event, "webhook": webhook, "run_id": run_id, "study_id": study_id,
            "metric": metric, "comparison": comparison, "threshold": threshold,
            "stall_minutes": stall_minutes, "format": format, "name": name,
        }  # fmt: skip
        return dict(
            self._request(
                "POST", "/api/alerts", json={k: v for k, v in body.items() if v is not None}
            )
        )

    def alerts(
        self, run_id: int | None = None, study_id: int | None = None
    ) -> list[dict[str, Any]]:
        """Your alert rules (``run_id``: those that watch that run)."""
        params = {"run_id": run_id, "study_id": study_id}
        return list(self._request("GET", "/api/alerts", params=params)["rules"])

    def delete_alert(self, rule_id: int) -> None:
        self._request("DELETE", f"/api/alerts/{rule_id}")

    def test_alert(self, rule_id: int) -> dict[str, Any]:
        """Call the rule's webhook once now: {delivered, error}."""
        return dict(self._request("POST", f"/api/alerts/{rule_id}/test"))

    def alert_firings(
        self, run_id: int | None = None, rule_id: int | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """What your rules fired, newest first, with each delivery's state."""
        params = {"run_id": run_id, "rule_id": rule_id, "limit": limit}
        return list(self._request("GET", "/api/alerts/firings", params=params)["firings"])

    def run_answers(
        self, run_id: int, step: str | int = "last", source: str = "held_out", text: bool = True
    ) -> dict[str, Any]:
        """One run's problems at one kept evaluation, and every evaluation it keeps per source
        (``sources``): ``GET /api/runs/{run_id}/answers``."""
        params = {"step": str(step), "source": source, "text": str(text).lower()}
        return dict(self._request("GET", f"/api/runs/{run_id}/answers", params=params))

    def answers(
        self,
        run_ids: Sequence[int],
        *,
        step: str | int = "last",
        source: str = "held_out",
        show: str = "all",
        text: bool = False,
        limit: int = 100,
        offset: int = 0,
    ) -> dict[str, Any]:
        """The runs' held-out (or a benchmark's) problems at one evaluation each, paired by
        problem, with each pair's solved-alone counts and McNemar's p (``GET /api/answers``)."""
        params = {
            "runs": ",".join(map(str, run_ids)), "step": str(step), "source": source,
            "show": show, "text": str(text).lower(), "limit": limit, "offset": offset,
        }  # fmt: skip
        return dict(self._request("GET", "/api/answers", params=params))

    def models(self) -> list[dict[str, Any]]:
        """The model registry: succeeded runs with a checkpoint, their lineage and last eval."""
        return list(self._request("GET", "/api/models")["models"])

    def export_model(self, run_id: int, step: str | int = "last") -> str:
        """Write the run's checkpoint as a Hugging Face directory on the server; its path."""
        data = self._request("POST", f"/api/models/{run_id}/export", json={"step": step})
        return str(data["path"])

    def download_model(
        self,
        run_id: int,
        into: str | Path,
        step: str | int = "last",
        *,
        retries: int = 5,
        retry_wait: float = 1.0,
    ) -> Path:
        """Export the run's checkpoint and download it into the directory ``into``, checked and
        unpacked (``fetch_model``); the model directory, which loads with
        ``AutoModelForCausalLM.from_pretrained``."""
        return self.fetch_model(run_id, into, step, retries=retries, retry_wait=retry_wait).path

    def fetch_model(
        self,
        run_id: int,
        into: str | Path,
        step: str | int = "last",
        *,
        retries: int = 5,
        retry_wait: float = 1.0,
    ) -> ModelDownload:
        """Export the run's checkpoint (``POST /api/models/{run_id}/export``: a LoRA merge may
        outlast what a GET may wait), then download its tar (``GET /api/runs/{run_id}/export``)
        to ``into/.run-<id>-<step>.tar.part``, check its SHA-256 and unpack it into ``into``.

        Resumable: a dropped connection (or a 502/503/504) is retried up to ``retries`` times in
        a row, waiting ``retry_wait`` s doubled each time, asking only for the bytes the partial
        file lacks (a Range, conditional on the tar being the same one: ``If-Range``); a server
        that answers the whole tar instead is read from its start. A partial file left by an
        earlier call that gave up is gone on from the same way. A tar whose SHA-256 is not the
        server's raises ``ChecksumMismatch`` and deletes the partial file; a tar is unpacked
        with tarfile's ``data`` filter (nothing outside ``into``, no links out, no devices)."""
        exported = self._request("POST", f"/api/models/{run_id}/export", json={"step": step})
        into = Path(into)
        into.mkdir(parents=True, exist_ok=True)
        name = Path(exported["path"]).name  # run-<id>-<step>, the tar's one directory
        part = into / f".{name}.tar.part"
        path = f"/api/runs/{run_id}/export"
        sha256, size, resumes = self._download(
            path, {"step": step}, part, exported["sha256"], exported["size"], retries, retry_wait
        )
        got = _file_sha256(part)
        if got != sha256:
            part.unlink(missing_ok=True)
            raise ChecksumMismatch(
                0,
                f"the download of {name}.tar has SHA-256 {got}, not the server's {sha256}: its"
                " partial file was deleted, download it again",
                "GET",
                path,
            )
        with tarfile.open(part, mode="r:") as archive:
            members = archive.getmembers()
            tops = {member.name.split("/", 1)[0] for member in members}
            if len(tops) != 1:
                raise ApiError(
                    0, f"the archive holds {sorted(tops)}, not one directory", "GET", path
                )
            archive.extractall(into, members=members, filter="data")
        part.unlink()
        return ModelDownload(into / tops.pop(), sha256, size, resumes)

    def _download(
        self,
        path: str,
        params: dict[str, Any],
        part: Path,
        sha256: str,
        size: int,
        retries: int,
        retry_wait: float,
    ) -> tuple[str, int, int]:
        """GET ``path`` into the file ``part``, going on from what it holds; the SHA-256 and the
        size the server states for what it sent (``Repr-Digest``; ``sha256`` and ``size`` until
        it says otherwise) and the resumes (see ``fetch_model``)."""
        failures = resumes = 0
        while True:
            have = part.stat().st_size if part.exists() else 0
            if have == size:
                return sha256, size, resumes
            if have > size:  # not a part of this tar
                part.unlink()
                have = 0
            headers = {"Range": f"bytes={have}-", "If-Range": f'"{sha256}"'} if have else {}
            timeout = httpx.Timeout(self._http.timeout.connect, read=60.0)
            try:
                with self._http.stream(
                    "GET", path, params=params, headers=headers, timeout=timeout
                ) as response:
                    if response.status_code >= 400:
                        response.read()
                        error = ApiError(response.status_code, _detail(response), "GET", path)
                        if response.status_code == 416:  # what it holds is no part of this tar
                            part.unlink()
                        if response.status_code not in (416, 502, 503, 504):
                            raise error
                        raise _TryAgain(str(error))
                    start = _range_start(response, have, path)
                    sha256 = _repr_sha256(response) or sha256
                    size = _total_size(response, size)
                    resumes += start > 0
                    with part.open("r+b" if start else "wb") as f:
                        f.seek(start)
                        f.truncate()
                        for chunk in response.iter_bytes():
                            f.write(chunk)
                            failures = 0  # it got on: the next failure is the first in a row
                        if f.tell() == start:
                            raise _TryAgain("the server sent no bytes")
            except (httpx.TransportError, _TryAgain) as exc:
                failures += 1
                if failures > retries:
                    raise ServerUnavailable(
                        0,
                        f"the download from {self.base_url} failed {failures} times in a row"
                        f" ({exc}); run it again to go on from {part}",
                        "GET",
                        path,
                    ) from exc
                time.sleep(retry_wait * 2 ** min(failures - 1, 5))

    def _text(self, method: str, path: str, params: dict[str, Any] | None = None) -> str:
        try:
            response = self._http.request(method, path, params=params)
        except httpx.TransportError as exc:
            raise ServerUnavailable(
                0, f"cannot reach {self.base_url}: {exc}", method, path
            ) from exc
        if response.status_code >= 400:
            raise ApiError(response.status_code, _detail(response), method, path)
        return response.text

    def presets(self) -> Presets:
        return Presets.model_validate(self._request("GET", "/api/presets"))

    def health(self) -> Health:
        return Health.model_validate(self._request("GET", "/api/health"))

    # --- live stream ------------------------------------------------------------------------

    def watch(
        self,
        run_id: int,
        since_step: int | None = None,
        max_retries: int = 5,
        retry_wait: float = 1.0,
    ) -> Iterator[StreamEvent]:
        """Yield the run's live events (``metrics``, ``status``) and finally ``end``.

        ``since_step``: the caller already has the points up to that step (those written
        later are still sent). A dropped connection reconnects with ``Last-Event-ID`` (the
        last event id seen, the server's write cursor), so no point is lost or repeated;
        after ``max_retries`` failed reconnects in a row the last error is raised as
        ``ServerUnavailable``. A 4xx (unknown run) raises ``ApiError``.
        """
        cursor: str | None = None
        failures = 0
        while True:
            headers = {"Accept": "text/event-stream"}
            params: dict[str, Any] = {}
            if since_step is not None:  # kept on reconnects, as a browser's EventSource does
                params["since_step"] = since_step
            if cursor is not None:
                headers["Last-Event-ID"] = cursor
            try:
                with self._http.stream(
                    "GET",
                    f"/api/runs/{run_id}/stream",
                    params=params,
                    headers=headers,
                    timeout=httpx.Timeout(self._http.timeout.connect, read=60.0),
                ) as response:
                    if response.status_code >= 400:
                        response.read()
                        path = f"/api/runs/{run_id}/stream"
                        raise ApiError(response.status_code, _detail(response), "GET", path)
                    for event in _parse_sse(response.iter_lines()):
                        failures = 0
                        if event.id is not None:
                            cursor = event.id
                        yield event
                        if event.event == "end":
                            return
                # The server closed the stream without an `end` event: reconnect.
                failures += 1
            except httpx.TransportError as exc:
                failures += 1
                if failures > max_retries:
                    raise ServerUnavailable(
                        0, f"stream of run {run_id} lost: {exc}", "GET", "stream"
                    ) from exc
            if failures > max_retries:
                raise ServerUnavailable(
                    0, f"stream of run {run_id} kept closing without an end event"
                )
            time.sleep(retry_wait * min(failures, 5))


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def _detail(response: httpx.Response) -> Any:
    try:
        body = response.json()
    except ValueError:
        return response.text or response.reason_phrase
    return body.get("detail", body) if isinstance(body, dict) else body


class _TryAgain(Exception):
    """An answer worth asking again for: a busy server (502, 503, 504), a 416."""


def _range_start(response: httpx.Response, have: int, path: str) -> int:
    """Where in the tar the response's bytes start: ``have`` for a 206 that goes on from there,
    0 for a 200 (the server sent the whole tar: it is read from its start)."""
    if response.status_code != 206:
        return 0
    answered = response.headers.get("Content-Range", "")
    if not answered.startswith(f"bytes {have}-"):
        raise ApiError(0, f"asked for bytes {have}- and got {answered!r}", "GET", path)
    return have


def _repr_sha256(response: httpx.Response) -> str | None:
    """The SHA-256 (hex) of ``Repr-Digest: sha-256=:<base64>:``, if the response has one."""
    for item in response.headers.get("Repr-Digest", "").split(","):
        algorithm, _, value = item.strip().partition("=")
        if algorithm == "sha-256" and value.startswith(":") and value.endswith(":"):
            return base64.b64decode(value[1:-1]).hex()
    return None


def _total_size(response: httpx.Response, size: int) -> int:
    """The tar's size by the response: a 206's Content-Range total, a 200's length."""
    if response.status_code == 206:
        total = response.headers.get("Content-Range", "").rpartition("/")[2]
        return int(total) if total.isdigit() else size
    length = response.headers.get("Content-Length", "")
    return int(length) if length.isdigit() else size


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _as_dict(config: BaseModel | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(config, BaseModel):
        return config.model_dump(mode="json")
    return dict(config)


def _finite(value: Any) -> Any:
    """Replace NaN/Inf floats with None, recursively (JSON cannot carry them)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _chunk_steps(steps: list[dict[str, Any]], limit: int) -> list[list[dict[str, Any]]]:
    """Group step rows into chunks of at most ``limit`` metric points (a step is never split
    unless it alone exceeds the limit)."""
    chunks: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    points = 0
    for row in steps:
        metrics = dict(row.get("metrics") or {})
        items = list(metrics.items()) or [("", None)]
        for start in range(0, len(items), limit):
            part = dict(items[start : start + limit]) if metrics else {}
            size = max(len(part), 1)
            if current and points + size > limit:
                chunks.append(current)
                current, points = [], 0
            current.append({**row, "metrics": part})
            points += size
    if current:
        chunks.append(current)
    return chunks


def _parse_sse(lines: Iterable[str]) -> Iterator[StreamEvent]:
    """Parse the text/event-stream format (comments and unknown fields ignored)."""
    event, event_id = "message", None
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                raw = "\n".join(data)
                try:
                    parsed: Any = json.loads(raw)
                except ValueError:
                    parsed = raw
                yield StreamEvent(event=event, data=parsed, id=event_id)
            elif event == "end":
                yield StreamEvent(event=event, data=None, id=event_id)
            event, data = "message", []
            continue
        if line.startswith(":"):
            continue  # comment (heartbeat)
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "event":
            event = value
        elif field == "data":
            data.append(value)
        elif field == "id":
            event_id = value or None
