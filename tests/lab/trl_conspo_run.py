"""A few ConSPOTrainer steps logging into a ConSPO Lab server (tests/lab/test_trl_conspo.py).

    python tests/lab/trl_conspo_run.py NAME STEPS
    accelerate launch --cpu --num_processes 2 tests/lab/trl_conspo_run.py NAME STEPS

The untrained tiny model (built in memory, nothing downloaded) and a deterministic 0/1 reward
read from the completion's characters, so groups come out mixed: the separation statistics have
values, not only empty groups. CONSPO_URL / CONSPO_TOKEN name the server.
"""

from __future__ import annotations

import os
import sys
import tempfile

from datasets import Dataset
from trl import GRPOConfig

from conspo.integrations.trl import ConSPOTrainer
from conspo.models.tiny import build_char_tokenizer, build_tiny_model
from conspo_lab.trl_bridge import ConSPOLabCallback

G = 4
PROMPTS = ["1+2=", "7-3=", "12+34=", "9-8="]  # one step's prompts (groups)


def parity_reward(completions: list[str], **_: object) -> list[float]:
    return [float(sum(map(ord, c)) % 2) for c in completions]


def main(name: str, steps: int) -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    tokenizer = build_char_tokenizer()
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-conspo-test-"),
        per_device_train_batch_size=len(PROMPTS) * G // world,
        num_generations=G,
        max_completion_length=6,
        max_steps=steps,
        learning_rate=1e-3,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        bf16=False,
        activation_checkpointing=False,
        save_strategy="no",
        seed=0,
    )
    lab = ConSPOLabCallback(run_name=name, algorithm="conspo", task="parity", flush_steps=1)
    trainer = ConSPOTrainer(
        model=build_tiny_model(tokenizer, seed=0),
        reward_funcs=parity_reward,
        args=config,
        train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS * steps]),
        processing_class=tokenizer,
        algorithm="conspo",
        params={"margin": "fixed"},
        callbacks=[lab],
    )
    trainer.train()
    if trainer.accelerator.is_main_process:
        print(f"logged to run {lab.run_id}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
