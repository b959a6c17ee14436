import json
import threading

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    AutoProcessor,
    AutoTokenizer,
    Qwen2ForCausalLM,
    Qwen2Tokenizer,
)

from conspo.config import ModelConfig
from conspo.models.builtins import builtin_store
from conspo.models.store import STORE_VERSION, load_policy
from conspo.models.tiny import build_char_tokenizer, build_tiny_model, save_tiny


def test_char_tokenizer_round_trips_through_save_pretrained(tmp_path):
    build_char_tokenizer().save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    text = "12+7=19 x*(3-y)\n?"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)  # one token per character, spaces and newlines included
    assert tok.decode(ids) == text
    assert tok.padding_side == "left"
    assert (tok.pad_token, tok.eos_token, tok.bos_token) == ("<pad>", "<eos>", "<bos>")
    batch = tok(["1+1=", "12+7="], padding=True)
    assert batch["input_ids"][0][0] == tok.pad_token_id and batch["attention_mask"][0][0] == 0
    assert tok.decode(ids + [tok.eos_token_id, tok.pad_token_id], skip_special_tokens=True) == text


def test_tiny_model_and_tokenizer_load_back_as_one_checkpoint(tmp_path):
    save_tiny(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "qwen2"
    tok = AutoTokenizer.from_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert isinstance(model, Qwen2ForCausalLM)
    # AutoTokenizer rebuilds a qwen2 checkpoint's tokenizer as Qwen2Tokenizer from the vocab
    # alone: the character tokenizer must come back exactly, whitespace included.
    assert isinstance(tok, Qwen2Tokenizer)
    text = " 12+7=19\n\n  x*(3-y) ~\n"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids == build_char_tokenizer()(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text) and tok.decode(ids) == text
    assert (tok.pad_token, tok.eos_token, tok.padding_side) == ("<pad>", "<eos>", "left")
    again = build_tiny_model(build_char_tokenizer(), seed=0)
    batch = tok(["12+7=", "1 - 2\n="], padding=True, return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, again(**batch).logits)


def test_trl_processing_class_loads_the_same_tokenizer(tmp_path):
    """TRL's GRPOTrainer loads a missing processing_class with AutoProcessor.from_pretrained."""
    save_tiny(tmp_path)
    proc = AutoProcessor.from_pretrained(tmp_path)
    text = "3 + 4\n= 7"
    assert proc.decode(proc(text, add_special_tokens=False)["input_ids"]) == text


def test_store_rebuilds_a_model_built_by_another_version(tmp_path):
    store = builtin_store(tmp_path)
    path = store.resolve("tiny")
    marker = path / "BUILT_BY_CONSPO"
    assert marker.read_text() == f"tiny\nversion {STORE_VERSION}\n"
    marker.write_text("tiny\n")  # what version 1 wrote
    (path / "stale").write_text("")
    assert store.resolve("tiny") == path
    assert f"version {STORE_VERSION}" in marker.read_text() and not (path / "stale").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["tiny"]


def test_store_builds_once_and_reuses(model_store, arith_base):
    marker = arith_base / "BUILT_BY_CONSPO"
    before = marker.stat().st_mtime_ns
    assert model_store.resolve("tiny-arith") == arith_base
    assert builtin_store(model_store.root).resolve("tiny-arith") == arith_base
    assert marker.stat().st_mtime_ns == before
    assert (model_store.root / "tiny" / "config.json").exists()  # the base it was built from


def test_concurrent_builds_build_once(tmp_path):
    store = builtin_store(tmp_path)
    builds = []

    def build(out):
        builds.append(out)
        save_tiny(out)

    threads = [threading.Thread(target=store._build_once, args=("x", build)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["x"]


def test_store_root_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("CONSPO_MODEL_STORE", str(tmp_path))
    assert builtin_store().root == tmp_path


def test_unknown_model_gives_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    store = builtin_store(tmp_path)
    with pytest.raises(FileNotFoundError, match="not in this machine's Hugging Face cache"):
        load_policy(ModelConfig(name="nobody/no-such-model-xyz"), store)
    with pytest.raises(FileNotFoundError, match="no such model directory"):
        store.resolve("./no/such/dir")


def test_load_policy_from_a_local_directory_on_cpu(tmp_path):
    save_tiny(tmp_path / "m")
    model, tok, device, dtype = load_policy(ModelConfig(name=str(tmp_path / "m"), device="cpu"))
    assert device.type == "cpu" and dtype == torch.float32
    assert next(model.parameters()).dtype == torch.float32 and tok.padding_side == "left"
