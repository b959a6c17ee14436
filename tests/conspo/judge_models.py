"""A scripted judge for the tests: a tiny causal LM that, after any chat prompt, writes one of a
few fixed texts, each with a known probability, as a real model's sampler draws it.

A random tiny model writes junk with no "Score: N" in it, so a judge reward on it can only fail;
this one is tiny-chat's tokenizer and chat template with weights set so the model is a bigram
table: every attention and MLP block writes nothing (their output projections are zero), so the
last position's hidden state is its token's embedding, and the LM head maps each token to the
next token(s) of the scripted texts. Where texts share a prefix, the first token that differs is
drawn among them with equal odds; the prompt's last token branches to every text's first."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

SCALE = 40.0  # the logit of a scripted next token; every other token's is near 0


def build_scripted_judge(base: Path, out: Path, texts: list[str]) -> Path:
    """A judge at ``out`` on ``base``'s tokenizer (it needs a chat template) that writes one of
    ``texts`` then its end token. A token may not lead to two different places unless the texts
    share everything before it (asserted): the odds are then equal at the branch."""
    tokenizer = AutoTokenizer.from_pretrained(base)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}], add_generation_prompt=True, tokenize=False
    )
    start = tokenizer(prompt, add_special_tokens=False).input_ids[-1]
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    nexts: dict[int, set[int]] = defaultdict(set)
    for text in texts:
        ids = [start, *tokenizer(text, add_special_tokens=False).input_ids, end]
        for a, b in zip(ids, ids[1:], strict=False):
            nexts[a].add(b)
    # a shared prefix branches once; any other token with two successors would mix the texts
    chains = [tokenizer(t, add_special_tokens=False).input_ids for t in texts]
    for token, following in nexts.items():
        if len(following) > 1:
            prefixes = {tuple(c[: c.index(token) + 1]) for c in chains if token in c}
            assert token == start or len(prefixes) == 1, (tokenizer.decode([token]), following)
    config = AutoConfig.from_pretrained(base)
    config.tie_word_embeddings = False
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                param.zero_()
            if "norm" in name:
                param.fill_(1.0)
        embed = model.get_input_embeddings().weight
        normed = embed / embed.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
        head = torch.zeros_like(model.lm_head.weight)
        for token, following in nexts.items():
            n = normed[token]
            for b in following:
                head[b] += SCALE * n / n.pow(2).sum()
        model.lm_head.weight.copy_(head)
    model.config.eos_token_id = end
    model.generation_config.eos_token_id = end
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
