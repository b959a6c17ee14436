"""Train with ConSPO inside TRL (``ConSPOTrainer``) and watch its separation curves in ConSPO Lab.

    conspo-lab serve --embedded &                    # or any ConSPO Lab server
    python examples/trl_conspo.py --steps 20         # then open http://127.0.0.1:8000
    accelerate launch --num_processes 2 examples/trl_conspo.py --steps 20   # same, 2 processes

A TRL user's switch is three lines, marked ``# <- ConSPO`` below: import ``ConSPOTrainer``
instead of ``GRPOTrainer``, name the objective (``algorithm``, any name of conspo.registry, and
its ``params``), and keep ``per_device_train_batch_size`` a multiple of ``num_generations`` (whole
groups). ``ConSPOLabCallback`` then streams TRL's metrics, the §4 separation statistics and a
sample of per-rollout scores into a lab run, so the run page shows what a native run shows.

Fully offline, like examples/trl_grpo.py: the model comes from the conspo model store
(``tiny-arith``, built once on first use; ``tiny`` is untrained), the data is built in memory.
The server URL and token come from --url/--token or CONSPO_URL/CONSPO_TOKEN.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig

from conspo.config import TaskConfig
from conspo.integrations.trl import ConSPOTrainer  # <- ConSPO
from conspo.models.builtins import builtin_store
from conspo.tasks import Example, make_task
from conspo_lab.trl_bridge import ConSPOLabCallback


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", default=None, help="ConSPO Lab server (default: CONSPO_URL).")
    p.add_argument("--token", default=None, help="API token (default: CONSPO_TOKEN, data/token).")
    p.add_argument("--model", default="tiny-arith", help="Model-store name, local dir or hub id.")
    p.add_argument("--model-store", default=None, help="Model store root (CONSPO_MODEL_STORE).")
    p.add_argument("--steps", type=int, default=20, help="Optimiser steps.")
    p.add_argument("--prompts-per-step", type=int, default=4, help="Prompts (groups) per step.")
    p.add_argument("--num-generations", type=int, default=4, help="G: completions per prompt.")
    p.add_argument("--max-new-tokens", type=int, default=6, help="Completion length cap.")
    p.add_argument(
        "--lr",
        type=float,
        default=3e-5,
        help="Learning rate (the tiny model degrades above ~5e-5).",
    )
    p.add_argument("--digits", type=int, default=1, help="Digits per operand.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--algorithm", default="conspo", help="Objective (conspo.registry name).")
    p.add_argument("--params", default="{}", help="Its parameters as JSON, e.g. '{\"tau\": 5}'.")
    p.add_argument("--name", default="trl-conspo-arith", help="Run name in the lab.")
    p.add_argument("--output-dir", default=None, help="Trainer output dir (default: a temp dir).")
    return p.parse_args(argv)


def world_size() -> int:
    """Processes of this launch (``accelerate launch`` sets WORLD_SIZE)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    params = json.loads(args.params)
    task_cfg = TaskConfig(name="arith", params={"digits": args.digits})
    task = make_task(task_cfg)
    examples = task.train_prompts(random.Random(args.seed), args.steps * args.prompts_per_step)
    dataset = Dataset.from_list(
        [{"prompt": ex.prompt, "answer": ex.answer, "value": ex.data["value"]} for ex in examples]
    )

    def arith_reward(prompts: list[str], completions: list[str], **columns) -> list[float]:
        """1.0 for the exact integer answer (the task's own verifier), else 0.0."""
        return [
            task.verify(completion, Example(prompt, str(value), {"value": value}))
            for prompt, completion, value in zip(
                prompts, completions, columns["value"], strict=True
            )
        ]

    path = builtin_store(args.model_store).resolve(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path)

    output_dir = args.output_dir or tempfile.mkdtemp(prefix="trl-conspo-")
    config = GRPOConfig(
        output_dir=output_dir,
        max_steps=args.steps,
        # Whole groups per process (<- ConSPO): with N processes, each takes prompts_per_step / N.
        per_device_train_batch_size=args.prompts_per_step * args.num_generations // world_size(),
        num_generations=args.num_generations,
        max_completion_length=args.max_new_tokens,
        learning_rate=args.lr,
        logging_steps=1,  # TRL's default (10) would average every 10 steps into one point
        report_to="none",
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,  # tiny model: nothing to save
        save_strategy="no",
        seed=args.seed,
    )
    lab = ConSPOLabCallback(
        args.url,
        args.token,
        run_name=args.name,
        config={
            **config.to_dict(),
            "task": task_cfg.model_dump(),
            "model": args.model,
            "algorithm": {"name": args.algorithm, "params": params},
        },
        tags=["trl", "example", args.algorithm],
        algorithm=args.algorithm,
        task="arith",
        model=args.model,
        binary_reward=True,  # arith rewards are 0/1, so the mean reward is the pass rate
    )
    trainer = ConSPOTrainer(
        algorithm=args.algorithm,  # <- ConSPO
        params=params,
        model=model,
        reward_funcs=arith_reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[lab],
    )
    try:
        trainer.train()
    except BaseException as exc:
        lab.fail(exc)
        raise
    if trainer.accelerator.is_main_process and lab.run_id is None:
        print(f"trained, but {lab.client.base_url} never answered: nothing was logged")
    elif trainer.accelerator.is_main_process:
        print(f"logged to run {lab.run_id} at {lab.client.base_url}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
