"""The ``dpo`` job kind: direct preference optimisation on (prompt, chosen, rejected) pairs.

    kind: dpo
    kind_params: {path: data/prefs.jsonl}        # columns prompt (a question), chosen, rejected
    kind_params: {from_run: 12}                  # pairs built from run 12's sampled rollouts

The loss is DPO's (Rafailov et al., 2023, Eq. 7), with the starting policy as the reference:

    L = −log σ(β · [(log π_θ(c|q) − log π_ref(c|q)) − (log π_θ(r|q) − log π_ref(r|q))])

log-probs summed over the response's tokens (EOS included) that the model wrote: an
``<interpreter>`` block inside a response (a rollout of a run with tools, a tool-use trace) is
the tool's output, not the policy's, and is left out of both sums
(``conspo.training.sft.answer_tokens``). With LoRA the reference is the base with the adapters
disabled; otherwise a frozen copy of the starting weights.

Pairs from a finished run (``from_run``): whoever launches the job writes them to
``workdir/dpo_pairs.jsonl`` first (the worker does, from the run's stored rollouts:
``build_pairs``). Only a sample of each step's rollouts is stored (``logging.rollout_sample``,
spread evenly over the batch), so a prompt pairs only when its stored rollouts hold both a
verified-correct and a wrong completion; prompts are the rendered text the policy saw, matched
exactly across steps.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field, model_validator

from conspo import metrics as M
from conspo.jobs.base import DatasetParams
from conspo.lazy import lazy_import
from conspo.registry import register_job_kind

if TYPE_CHECKING:
    import torch

    from conspo.access import DataFiles
    from conspo.config import RunConfig
    from conspo.models.store import ModelStore
    from conspo.training.loop import TrainResult, TrainState
else:
    torch = lazy_import("torch")

PAIRS_FILE = "dpo_pairs.jsonl"  # in the job's workdir, for kind_params.from_run


class DPOParams(DatasetParams):
    # path: the pairs, columns prompt (a question, rendered like every prompt), chosen, rejected
    from_run: int | None = Field(
        None,
        ge=1,
        le=2**31 - 1,
        description="Build the pairs from this finished run's stored rollouts instead: a"
        " verified-correct vs a wrong completion of the same prompt.",
    )
    max_pairs_per_prompt: int = Field(
        4, ge=1, le=1000, description="from_run: pairs kept per prompt (each completion once)."
    )
    beta: float = Field(
        0.1, gt=0, le=100, description="β: the strength of the KL to the reference."
    )
    batch_size: int = Field(8, ge=1, le=4096, description="Pairs per step.")

    @model_validator(mode="after")
    def _one_source(self) -> DPOParams:
        if (self.path is None) == (self.from_run is None):
            raise ValueError("give exactly one of path (a pairs dataset) and from_run (a run id)")
        return self


@dataclass(frozen=True)
class Pair:
    prompt: str  # as the policy sees it (rendered)
    chosen: str
    rejected: str


def build_pairs(
    rollouts: Iterable[tuple[str, str, bool]], max_per_prompt: int
) -> tuple[list[Pair], dict[str, int]]:
    """Pairs from (prompt, completion, verified correct) rollouts, and counts for the report.

    Per prompt, in the order given: the i-th distinct correct completion is paired with the i-th
    distinct wrong one, up to ``max_per_prompt`` (each completion in one pair at most).
    """
    by_prompt: dict[str, tuple[list[str], list[str]]] = {}
    n = 0
    for prompt, completion, correct in rollouts:
        n += 1
        good, bad = by_prompt.setdefault(prompt, ([], []))
        side = good if correct else bad
        if completion not in side:
            side.append(completion)
    pairs = [
        Pair(prompt, c, r)
        for prompt, (good, bad) in by_prompt.items()
        for c, r in list(zip(good, bad, strict=False))[:max_per_prompt]
    ]
    paired = len({p.prompt for p in pairs})
    return pairs, {"rollouts": n, "prompts": len(by_prompt), "paired_prompts": paired}


def write_pairs(pairs: list[Pair], path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(asdict(p)) + "\n" for p in pairs))
    tmp.replace(path)


def pairs_from_run(
    config: RunConfig,
    workdir: Path,
    rollouts_of: Callable[[int], Iterable[tuple[str, str, float | None]]],
) -> None:
    """The job's inputs (``RegisteredJobKind.inputs``): with ``from_run``, the pairs built from
    that run's stored rollouts, written to ``workdir/dpo_pairs.jsonl`` once (a resumed attempt
    reuses them). A rollout is correct when its reward passes the one positive threshold."""
    from conspo.objectives.base import is_positive

    params = config.typed("kind_params", DPOParams)
    path = workdir / PAIRS_FILE
    if params.from_run is None or path.is_file():
        return
    rollouts = ((p, c, is_positive(r)) for p, c, r in rollouts_of(params.from_run))
    pairs, _ = build_pairs(rollouts, params.max_pairs_per_prompt)
    write_pairs(pairs, path)


@register_job_kind(
    "dpo",
    params=DPOParams,
    description="Direct preference optimisation on (chosen, rejected) pairs: a dataset"
    " (kind_params.path, columns prompt, chosen, rejected; the prompt a question, rendered like"
    " every prompt), or a finished run's correct vs wrong rollouts.",
    metrics=(M.LOSS, M.GRAD_NORM, M.DPO_ACCURACY, M.DPO_MARGIN, M.DPO_CHOSEN, M.DPO_REJECTED),
    input_runs=("from_run",),
    inputs=pairs_from_run,
    # pairs from run 1's stored rollouts: whoever runs the example hands pairs_from_run a few
    # (prompt, completion, reward) of that run (the registry test: a correct and a wrong answer
    # to some of the task's prompts), so no dataset file is needed
    example_params={"from_run": 1},
)
def train_dpo(config: RunConfig, *args: Any, **kwargs: Any) -> TrainResult:
    from conspo.training.loop import one_update_per_step, run_loop

    workdir = Path(kwargs["workdir"])
    return run_loop(
        config,
        *args,
        start=one_update_per_step(lambda s, f, m: start(s, f, m, workdir)),
        **kwargs,
    )


def load_pairs(params: DPOParams, files: DataFiles, workdir: Path, render: Any) -> list[Pair]:
    if params.from_run is not None:
        path = workdir / PAIRS_FILE
        if not path.is_file():
            raise ValueError(
                f"kind_params.from_run: the pairs of run {params.from_run} were not prepared"
                f" ({path} is missing)"
            )
        pairs = [Pair(**json.loads(line)) for line in path.read_text().splitlines() if line]
        where = f"run {params.from_run}'s stored rollouts"
    else:
        from conspo.tasks.datasets import load_dataset_file

        assert params.path is not None
        rows = load_dataset_file(files, params.path).to_list()
        missing = {"prompt", "chosen", "rejected"} - set(rows[0] if rows else {})
        if missing:
            raise ValueError(f"kind_params.path: {params.path} lacks columns {sorted(missing)}")
        pairs = [Pair(render(r["prompt"]), r["chosen"], r["rejected"]) for r in rows]
        where = params.path
    if not pairs:
        raise ValueError(
            f"no preference pairs in {where}: it needs prompts with both a correct and a wrong"
            " completion"
        )
    return pairs


def start(state: TrainState, files: DataFiles, store: ModelStore, workdir: Path) -> Any:
    import copy

    from conspo.tasks.prompts import PromptRenderer
    from conspo.training.logprobs import sequence_logprobs
    from conspo.training.loop import optimiser_step, step_seed
    from conspo.training.sft import answer_rows

    cfg = state.cfg
    params = cfg.typed("kind_params", DPOParams)
    pairs = load_pairs(params, files, workdir, PromptRenderer(cfg.prompt, state.tokenizer))
    lora = cfg.model.lora.rank > 0
    ref = None if lora else copy.deepcopy(state.model).eval().requires_grad_(False)

    def reference(ids: Any, mask: Any, labels: Any) -> Any:
        with torch.no_grad():
            if ref is not None:
                return sequence_logprobs(ref, ids, mask, labels)[0]
            with state.model.disable_adapter():  # type: ignore[operator]  # a peft model
                return sequence_logprobs(state.model, ids, mask, labels)[0]

    def step(step: int) -> dict[str, float]:
        rng = random.Random(step_seed(cfg.seed, step, "dpo"))
        drawn = [pairs[rng.randrange(len(pairs))] for _ in range(params.batch_size)]
        rows = [(p.prompt, p.chosen) for p in drawn] + [(p.prompt, p.rejected) for p in drawn]
        ids, mask, labels = answer_rows(state.tokenizer, rows, state.device, 0)
        state.model.eval()  # no dropout: π_θ and π_ref score the same way
        policy = sequence_logprobs(state.model, ids, mask, labels)[0]
        ratio = policy - reference(ids, mask, labels)  # (2B,) log π_θ/π_ref per response
        b = len(drawn)
        chosen, rejected = params.beta * ratio[:b], params.beta * ratio[b:]
        margin = chosen - rejected
        loss = -torch.nn.functional.logsigmoid(margin).mean()
        grad_norm = optimiser_step(state, loss)
        return {
            M.LOSS: loss.item(),
            M.GRAD_NORM: grad_norm,
            M.DPO_ACCURACY: float((margin > 0).float().mean()),
            M.DPO_MARGIN: float(margin.detach().mean()),
            M.DPO_CHOSEN: float(chosen.detach().mean()),
            M.DPO_REJECTED: float(rejected.detach().mean()),
        }

    return step
