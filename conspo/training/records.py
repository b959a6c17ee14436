"""What one RL step hands the sink: the step record with its statistics, a sample of rollouts with
their texts, and one record per distinct prompt.

    record = make_record(state, step, stats, floats, rollouts, scores)

Every tensor statistic crosses from the device to the host in one copy per step.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from conspo.sink import RolloutRecord, StepRecord, clip_text, episode_json
from conspo.training.loop import TrainState
from conspo.training.rollouts import Rollouts, prompt_records


def make_record(
    state: TrainState,
    step: int,
    stats: dict[str, torch.Tensor],
    floats: dict[str, float],
    r: Rollouts,
    scores: torch.Tensor,
) -> StepRecord:
    """Build the StepRecord with a single device→host copy of every tensor statistic."""
    n = len(r.group_ids)
    keep = min(state.cfg.logging.rollout_sample, n)
    idx = (
        torch.linspace(0, n - 1, keep).round().long() if keep else torch.empty(0, dtype=torch.long)
    )
    keys = list(stats)
    b = r.batch
    model_lengths = b.model_lengths  # the model's own tokens, as len/* counts them
    packed = torch.cat(
        [
            torch.stack([stats[k] for k in keys]),
            scores.float()[idx.to(scores.device)],
            model_lengths[idx.to(model_lengths.device)].float().to(scores.device),
            b.truncated[idx.to(model_lengths.device)].float().to(scores.device),
        ]
    )
    values = packed.cpu().tolist()  # the step's one device→host sync
    metrics = {**dict(zip(keys, values[: len(keys)], strict=True)), **floats}
    g = state.cfg.sampling.group_size
    sample_scores, lengths, truncated = (
        values[len(keys) + j * keep : len(keys) + (j + 1) * keep] for j in range(3)
    )
    prompts_text, completions = sampled_texts(state, r, idx.tolist())
    episodes = sampled_episodes(r, idx.tolist())
    records = [
        RolloutRecord(
            group=i // g,
            index=i % g,
            reward=float(r.correct[i]),
            score=s,
            length=int(n_tok),
            truncated=bool(tr),
            prompt=p_text,
            completion=c_text,
            episode=episode,
            critique=None if r.critiques is None else _clipped(r.critiques[i]),
        )
        for i, s, n_tok, tr, p_text, c_text, episode in zip(
            idx.tolist(),
            sample_scores,
            lengths,
            truncated,
            prompts_text,
            completions,
            episodes,
            strict=True,
        )
    ]
    metrics = {k: (v if math.isfinite(v) else float("nan")) for k, v in metrics.items()}
    prompts = r.prompts if r.prompts is not None else prompt_records(state, r)
    return StepRecord(step, state.cfg.steps, time.time(), metrics, records, prompts)


def sampled_texts(state: TrainState, r: Rollouts, rows: list[int]) -> tuple[list[str], list[str]]:
    """(prompt, completion) texts of the sampled rollout ``rows``, clipped to
    ``ROLLOUT_TEXT_CHARS``: a few dozen rows decoded once per step, for the rollout table."""
    if not rows:
        return [], []
    b = r.batch
    at = torch.tensor(rows, dtype=torch.long)
    p_ids, p_mask = b.prompt_ids[at.to(b.prompt_ids.device)].cpu(), b.prompt_mask.cpu()[at]
    prompts = state.tokenizer.batch_decode(
        [ids[m.bool()].tolist() for ids, m in zip(p_ids, p_mask, strict=True)]
    )
    completions = state.tokenizer.batch_decode(
        b.response_ids[at.to(b.response_ids.device)].cpu().tolist(), skip_special_tokens=True
    )
    return [clip_text(t) for t in prompts], [clip_text(t) for t in completions]


def _clipped(text: str | None) -> str | None:
    return None if text is None else clip_text(text)


def sampled_episodes(r: Rollouts, rows: list[int]) -> list[dict[str, Any] | None]:
    """The episodes the sampled rollout ``rows`` played, as the rollout table keeps them
    (``episode_json``); None for a row that played none (every row, in a run without an
    environment)."""
    episodes = r.batch.episodes
    if episodes is None:
        return [None] * len(rows)
    return [None if episodes[i] is None else episode_json(episodes[i]) for i in rows]
