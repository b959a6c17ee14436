"""Command line: ``python -m conspo train run.yaml --out DIR``, ``python -m conspo sft`` and
``python -m conspo export``.

    python -m conspo sft --task arith --param digits=2 --param num_operands=3 --out DIR
    python -m conspo export DIR/checkpoints/step_000050 --out MODEL_DIR

train writes DIR/config.json (the resolved config), DIR/metrics.jsonl (one JSON line per step),
DIR/events.jsonl and DIR/checkpoints/; run it again with the same DIR to resume. A bad config
prints the offending field and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from conspo.access import DatasetTooLarge
from conspo.config import RunConfig, TaskConfig
from conspo.registry import task_names
from conspo.sink import JsonlSink, StepRecord
from conspo.training.checkpoint import latest_checkpoint

PROGRESS_KEYS = {"sep/gap": "gap", "batch/pass_rate": "pass", "eval/accuracy": "acc"}


class ProgressSink(JsonlSink):
    """JsonlSink plus a tqdm bar showing the separation gap, pass rate and held-out accuracy."""

    def __init__(self, path: Path, total: int, initial: int) -> None:
        from tqdm import tqdm

        super().__init__(path)
        self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)
        self.shown: dict[str, str] = {}

    def log_step(self, record: StepRecord) -> None:
        super().log_step(record)
        for key, label in PROGRESS_KEYS.items():
            if key in record.metrics:
                self.shown[label] = f"{record.metrics[key]:.3f}"
        self.bar.set_postfix(self.shown, refresh=False)
        self.bar.update(record.step - self.bar.n)


def config_errors(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"]) or "(config)"
        lines.append(f"  {field}: {err['msg']}")
    return "invalid config:\n" + "\n".join(lines)


def load_config(path: str, overrides: dict[str, Any]) -> RunConfig:
    cfg = RunConfig.from_file(path)
    if overrides:
        cfg = RunConfig.model_validate({**cfg.model_dump(), **overrides})
    return cfg


def truncate_metrics(path: Path, last_step: int) -> None:
    """Drop metric lines past the checkpoint we resume from: they will be logged again."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if json.loads(line)["step"] <= last_step]
    path.write_text("".join(line + "\n" for line in kept))


def same_config(path: Path, cfg: RunConfig) -> bool:
    """Whether the config.json at ``path`` resolves to ``cfg`` (it may be in an older form, such
    as the flat task section, that validation still accepts)."""
    try:
        return RunConfig.model_validate_json(path.read_text()) == cfg
    except ValidationError:
        return False


def cmd_train(args: argparse.Namespace) -> int:
    from conspo.launch import launch
    from conspo.models.builtins import builtin_store

    overrides = {"steps": args.steps} if args.steps else {}
    try:
        cfg = load_config(args.config, overrides)
    except ValidationError as exc:
        print(config_errors(exc), file=sys.stderr)
        return 2
    except (OSError, ValueError) as exc:  # unreadable file, YAML/JSON syntax
        print(f"cannot read config {args.config}: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    resolved = json.dumps(cfg.model_dump(mode="json"), indent=2)
    found = latest_checkpoint(out)
    if found and (out / "config.json").exists() and not same_config(out / "config.json", cfg):
        print(f"{out} holds a run with a different config; use another --out", file=sys.stderr)
        return 2
    (out / "config.json").write_text(resolved)
    start = found[0] if found else 0
    truncate_metrics(out / "metrics.jsonl", start)
    sink = ProgressSink(out / "metrics.jsonl", cfg.steps, start)
    try:
        # One process, or resources.gpus processes of this machine (conspo.launch); a multi-node
        # config needs a Ray cluster, which the platform's workers have and this command not.
        result = launch(cfg, sink, workdir=out, model_store=builtin_store(args.model_store))
    except (FileNotFoundError, DatasetTooLarge) as exc:  # model.name or a dataset (conspo.access)
        sink.bar.close()
        print(exc, file=sys.stderr)
        return 2
    sink.bar.close()
    print(f"{result.status} at step {result.last_step}; metrics in {out / 'metrics.jsonl'}")
    return 0


def cmd_sft(args: argparse.Namespace) -> int:
    from conspo.models.builtins import builtin_store
    from conspo.training.sft import sft

    try:
        task = TaskConfig(name=args.task, params=dict(args.param))
    except ValidationError as exc:
        print(config_errors(exc), file=sys.stderr)
        return 2
    base = builtin_store(args.model_store).resolve(args.base)
    out = sft(base, [task], args.out, steps=args.steps)
    print(f"saved {out}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from conspo.models.export import export_merged

    checkpoint = Path(args.checkpoint)
    if not (checkpoint / "trainer_state.pt").exists():
        print(f"{checkpoint} is not a checkpoint (no trainer_state.pt)", file=sys.stderr)
        return 2
    if Path(args.out).exists():
        print(f"{args.out} exists; export writes a new directory", file=sys.stderr)
        return 2
    try:
        out = export_merged(checkpoint, args.base, args.out)
    except (OSError, ValueError) as exc:  # the base model is not where the checkpoint says
        print(f"cannot export {checkpoint}: {exc}", file=sys.stderr)
        return 2
    print(f"saved {out}")
    return 0


def key_value(text: str) -> tuple[str, Any]:
    """``digits=2`` → ("digits", 2): VALUE is read as JSON when it parses, else kept as text."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conspo")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads for torch (default 1: tiny models run fastest single-threaded;"
        " 0 keeps torch's default)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train from a YAML/JSON RunConfig (resumes in --out)")
    t.add_argument("config")
    t.add_argument("--out", required=True, help="run directory (metrics, checkpoints)")
    t.add_argument("--steps", type=int, default=None, help="override config.steps")
    t.add_argument("--model-store", default=None, help="default: $CONSPO_MODEL_STORE")
    t.set_defaults(fn=cmd_train)
    s = sub.add_parser("sft", help="SFT warm start of a tiny model on a task")
    s.add_argument("--task", choices=task_names(), default="arith")
    s.add_argument(
        "--param",
        type=key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a task parameter (repeatable; VALUE is JSON or text); the rest take its defaults",
    )
    s.add_argument("--out", required=True)
    s.add_argument("--steps", type=int, default=400)
    s.add_argument("--base", default="tiny", help="model-store name or directory")
    s.add_argument("--model-store", default=None)
    s.set_defaults(fn=cmd_sft)
    e = sub.add_parser("export", help="a checkpoint as a plain model directory (LoRA merged)")
    e.add_argument("checkpoint", help="a checkpoint directory (DIR/checkpoints/step_NNNNNN)")
    e.add_argument("--out", required=True, help="the new model directory")
    e.add_argument("--base", default=None, help="LoRA: the base model (default: as recorded)")
    e.set_defaults(fn=cmd_export)
    args = parser.parse_args(argv)
    _quiet_and_fast(args.threads)
    return args.fn(args)


def _quiet_and_fast(threads: int) -> None:
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # checkpoint saves would interleave with our bar
    if threads > 0:
        torch.set_num_threads(threads)
