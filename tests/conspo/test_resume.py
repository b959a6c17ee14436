import json
import math

import pytest

from conspo.cli import main, truncate_metrics
from conspo.config import RunConfig
from conspo.sink import MemorySink
from conspo.training.trainer import train

# Timings and the system readings (conspo.system: sampled by the clock) differ run to run.
TIMING = ("time/", "throughput/", "system/")


def config(steps: int = 6) -> RunConfig:
    return RunConfig.model_validate({
        "algorithm": "conspo",
        "steps": steps,
        "seed": 3,
        "task": {"name": "arith", "params": {"digits": 1, "num_operands": 3}, "eval_size": 32},
        "model": {"name": "tiny-arith"},
        "sampling": {"prompts_per_step": 8, "group_size": 4, "max_new_tokens": 6},
        "optim": {"lr": 1e-4, "mini_batches": 2},
        "eval": {"every": 2, "pass_k": 2},
        "checkpoint": {"every": 0, "keep": 1},
    })  # fmt: skip


def comparable(sink: MemorySink) -> dict:
    """Metrics minus timings, with NaN made comparable (nan != nan)."""
    return {
        step: (
            {
                k: ("nan" if math.isnan(v) else v)
                for k, v in rec.metrics.items()
                if not k.startswith(TIMING)
            },
            rec.rollouts,
        )  # fmt: skip
        for step, rec in sink.steps.items()
    }


def test_interrupted_and_resumed_run_equals_the_uninterrupted_one(model_store, arith_base,
                                                                  tmp_path):  # fmt: skip
    whole = MemorySink()
    train(config(), whole, workdir=tmp_path / "whole", model_store=model_store)

    first, second = MemorySink(), MemorySink()
    stopped = train(config(), first, lambda: max(first.steps) >= 3,
                    workdir=tmp_path / "split", model_store=model_store)  # fmt: skip
    assert (stopped.status, stopped.last_step) == ("cancelled", 3)
    done = train(config(), second, workdir=tmp_path / "split", model_store=model_store)
    assert (done.status, done.last_step) == ("succeeded", 6)
    # The step-0 evaluation (eval.at_start) belongs to the fresh run only, never to a resume.
    assert sorted(first.steps) == [0, 1, 2, 3] and sorted(second.steps) == [4, 5, 6]
    assert second.events[0][0] == "resumed" and second.events[0][1]["step"] == 3
    joined = MemorySink()
    joined.steps = {**first.steps, **second.steps}
    assert comparable(joined) == comparable(whole)
    # keep=1: only the final checkpoint is left
    assert [p.name for p in (tmp_path / "split" / "checkpoints").iterdir()] == ["step_000006"]


def test_truncate_metrics_drops_steps_after_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "x": s}) + "\n" for s in [1, 2, 3, 4]))
    truncate_metrics(path, 2)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]


def test_cli_bad_config_names_the_field(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("sampling:\n  group_size: 1\n")
    assert main(["train", str(bad), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "sampling.group_size" in err and "Traceback" not in err


def test_cli_train_and_resume_leave_no_duplicate_lines(model_store, arith_base, tmp_path,
                                                       monkeypatch):  # fmt: skip
    monkeypatch.setenv("CONSPO_MODEL_STORE", str(model_store.root))
    cfg = tmp_path / "run.json"
    data = config(steps=2).model_dump(mode="json")
    data["optim"]["mini_batches"] = 1
    cfg.write_text(json.dumps(data))
    out = tmp_path / "out"
    assert main(["--threads", "0", "train", str(cfg), "--out", str(out)]) == 0
    # Simulate a crash after step 2's line was written but before a later checkpoint.
    with (out / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 3, "x": 1}) + "\n")
    data["steps"] = 3
    cfg.write_text(json.dumps(data))
    assert main(["--threads", "0", "train", str(cfg), "--out", str(out)]) == 2  # config changed
    assert main(["--threads", "0", "train", str(cfg), "--out", str(out), "--steps", "2"]) == 0
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2]
    assert json.loads((out / "config.json").read_text())["steps"] == 2


@pytest.mark.parametrize("name", ["./nowhere/model"])
def test_cli_unknown_model_exits_2(name, tmp_path, capsys):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"model:\n  name: {name}\nsteps: 1\n")
    assert main(["train", str(cfg), "--out", str(tmp_path / "o")]) == 2
    assert "model.name" in capsys.readouterr().err


class Crash(Exception):
    pass


class BufferingSink(MemorySink):
    """Persists steps only on flush(), like the worker's DB sink; ``stored`` is the database.

    ``writes`` lists every step each flush persisted, so a step stored twice would show.
    """

    def __init__(self, stored: dict, writes: list) -> None:  # type: ignore[type-arg]
        super().__init__()
        self.stored, self.writes = stored, writes
        self.buffer: dict = {}  # type: ignore[type-arg]

    def log_step(self, record) -> None:  # type: ignore[no-untyped-def]
        self.buffer[record.step] = record

    def flush(self) -> None:
        self.writes += sorted(self.buffer)
        self.stored.update(self.buffer)
        self.buffer.clear()


def test_a_buffering_sink_that_crashes_after_a_checkpoint_loses_no_step(
    model_store, arith_base, tmp_path
):  # type: ignore[no-untyped-def]
    """Steps buffered after the last checkpoint die with the process; the resume re-emits them."""
    cfg = config(steps=7).model_copy(
        update={"checkpoint": config().checkpoint.model_copy(update={"every": 2})}
    )
    stored: dict = {}  # type: ignore[type-arg]
    writes: list = []  # type: ignore[type-arg]
    first = BufferingSink(stored, writes)

    def crash_after_step_5() -> bool:
        if 5 in first.buffer:  # step 5 logged, not flushed: the process dies here
            raise Crash
        return False

    with pytest.raises(Crash):
        train(cfg, first, crash_after_step_5, workdir=tmp_path, model_store=model_store)
    assert sorted(stored) == [0, 1, 2, 3, 4]  # flushed before the checkpoints at 2 and 4
    second = BufferingSink(stored, writes)
    done = train(cfg, second, workdir=tmp_path, model_store=model_store)
    assert (done.status, done.last_step) == ("succeeded", 7)
    assert second.events[0][0] == "resumed" and second.events[0][1]["step"] == 4
    assert second.buffer == {}  # the run's end flushed the tail
    assert writes == [0, 1, 2, 3, 4, 5, 6, 7]  # every step stored exactly once (0: at_start)
