"""What a config may make a process read: dataset files inside the data roots, models from the
store, the model roots or allowed hub ids (conspo.access), through the jsonl task and the store."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from pydantic import ValidationError

from conspo.access import DataFiles, DatasetTooLarge, ModelSources, Unavailable
from conspo.config import ModelConfig, TaskConfig
from conspo.models.builtins import builtin_store
from conspo.models.store import load_policy
from conspo.models.tiny import save_tiny
from conspo.tasks import make_task


@pytest.fixture
def places(tmp_path: Path) -> dict[str, Path]:
    """A data root holding train.jsonl, and beside it (outside the root) a secret file."""
    root, outside = tmp_path / "datasets", tmp_path / "private"
    root.mkdir()
    outside.mkdir()
    rows = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(30)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (outside / "secret.jsonl").write_text((root / "train.jsonl").read_text())
    return {"root": root, "outside": outside}


def jsonl(path: str, **more: str) -> TaskConfig:
    return TaskConfig(name="jsonl", params={"path": path, **more})


def test_relative_paths_resolve_inside_each_root_in_turn(places, tmp_path):
    other = tmp_path / "more"
    (other / "sub").mkdir(parents=True)
    (other / "sub" / "held.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
    files = DataFiles(roots=(places["root"], other))
    task = make_task(jsonl("train.jsonl", eval_path="sub/held.jsonl"), files)
    assert [ex.prompt for ex in task.eval_examples(5)] == ["1+1="]
    assert len(task.train_prompts(random.Random(0), 4)) == 4
    absolute = str(places["root"] / "train.jsonl")  # an absolute path inside a root is fine
    assert make_task(jsonl(absolute), files).eval_examples(1)


def refused_names(places: dict[str, Path]) -> dict[str, str]:
    """Names a data root must refuse, each made real first (the file exists where it points)."""
    root, outside = places["root"], places["outside"]
    (root / "escape.jsonl").symlink_to(outside / "secret.jsonl")
    (root / "private").symlink_to(outside, target_is_directory=True)
    (root / "zeros.jsonl").symlink_to("/dev/zero")
    (root / "adir.jsonl").mkdir()
    os.mkfifo(root / "pipe.jsonl")
    return {
        "absolute outside": str(outside / "secret.jsonl"),
        "dot-dot": "../private/secret.jsonl",
        "dot-dot inside a name": "sub/../../private/secret.jsonl",
        "symlinked file": "escape.jsonl",
        "symlinked directory": "private/secret.jsonl",
        "/dev/zero": "/dev/zero",
        "symlink to /dev/zero": "zeros.jsonl",
        "a directory": "adir.jsonl",
        "a FIFO (never opened: it would block)": "pipe.jsonl",
        "missing": "nothing-here.jsonl",
        "NUL byte": "a\x00b.jsonl",
    }


def test_what_lies_outside_the_roots_or_is_not_a_regular_file_is_refused(places):
    files = DataFiles(roots=(places["root"],))
    for case, name in refused_names(places).items():
        with pytest.raises(Unavailable):
            files.check(name)
        if "\x00" in name:  # the config refuses it first: no task is ever built with it
            with pytest.raises(ValidationError, match="NUL"):
                jsonl(name)
            continue
        with pytest.raises(Unavailable):
            make_task(jsonl(name), files)
        with pytest.raises(Unavailable):
            make_task(jsonl("train.jsonl", eval_path=name), files)
        print("refused:", case)


def test_a_refusal_says_the_same_whether_missing_outside_or_not_a_file(places):
    """No file-probing oracle: only the name differs between the messages."""
    files = DataFiles(roots=(places["root"],))
    messages = set()
    for name in refused_names(places).values():
        with pytest.raises(Unavailable) as info:
            files.read_text(name)
        messages.add(str(info.value).replace(repr(name), "NAME"))
    assert len(messages) == 1, messages
    assert "data roots" in messages.pop()


def test_dev_zero_is_refused_even_without_roots():
    """The library's unbounded default still reads only regular files, never a device."""
    with pytest.raises(Unavailable):
        make_task(jsonl("/dev/zero"), DataFiles())
    with pytest.raises(Unavailable):
        make_task(jsonl("/dev/zero"))


def test_a_huge_sparse_file_is_refused_before_it_is_read(places):
    huge = places["root"] / "huge.jsonl"
    with huge.open("wb") as f:
        f.truncate(64 * 2**30)  # 64 GiB that occupy no disk: reading it would fill memory
    files = DataFiles(roots=(places["root"],), max_bytes=2**20)
    with pytest.raises(DatasetTooLarge, match="over the size cap of 1,048,576 bytes"):
        files.check("huge.jsonl")
    with pytest.raises(DatasetTooLarge):
        make_task(jsonl("huge.jsonl"), files)
    with pytest.raises(DatasetTooLarge):  # the library default has a cap too
        make_task(jsonl(str(huge)))


def test_the_cap_is_exact(places):
    data = (places["root"] / "train.jsonl").read_bytes()
    exact = DataFiles(roots=(places["root"],), max_bytes=len(data))
    assert exact.read_text("train.jsonl").encode() == data
    with pytest.raises(DatasetTooLarge):
        DataFiles(roots=(places["root"],), max_bytes=len(data) - 1).read_text("train.jsonl")


def test_a_malformed_line_in_an_allowed_file_names_the_line(places):
    (places["root"] / "bad.jsonl").write_text('{"prompt": "1=", "answer": "1"}\n{"prompt": 2}\n')
    files = DataFiles(roots=(places["root"],))
    with pytest.raises(ValueError, match="bad.jsonl:2: expected"):
        make_task(jsonl("bad.jsonl"), files)
    (places["root"] / "latin1.jsonl").write_bytes(b'{"prompt": "caf\xe9", "answer": "1"}\n')
    with pytest.raises(ValueError, match="latin1.jsonl: not UTF-8"):
        make_task(jsonl("latin1.jsonl"), files)


# ------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def model_places(tmp_path: Path) -> dict[str, Path]:
    """A model root holding a tiny model, another model outside it, an empty directory."""
    root, outside = tmp_path / "models", tmp_path / "elsewhere"
    save_tiny(root / "mine")
    save_tiny(outside / "theirs")
    (root / "empty").mkdir()
    (root / "link").symlink_to(outside / "theirs", target_is_directory=True)
    return {"root": root, "outside": outside}


def test_models_load_from_the_store_the_roots_or_allowed_hub_ids(model_places):
    sources = ModelSources(roots=(model_places["root"],), hub_allow=("Qwen/*", "org/exact"))
    assert sources.locate("tiny").kind == "builtin"
    mine = sources.locate("mine")
    assert mine.kind == "local" and mine.path == (model_places["root"] / "mine").resolve()
    assert sources.locate(str(model_places["root"] / "mine")).kind == "local"
    assert sources.locate("Qwen/Qwen2.5-0.5B-Instruct").kind == "hub"
    assert sources.locate("org/exact").kind == "hub"
    for name in ("org/exact-not", "other/model", "gpt2", "Qwen"):
        with pytest.raises(Unavailable, match="a hub id the operator allows"):
            sources.locate(name)


def test_paths_that_leave_the_model_roots_are_refused_alike(model_places):
    sources = ModelSources(roots=(model_places["root"],), hub_allow=())
    names = ["../../..", "../elsewhere/theirs", str(model_places["outside"] / "theirs"), "link",
             "empty", "/", "~", "missing", "a\x00b"]  # fmt: skip
    messages = set()
    for name in names:
        with pytest.raises(Unavailable) as info:
            sources.locate(name)
        messages.add(str(info.value).replace(repr(name), "NAME"))
    assert len(messages) == 1, messages
    assert "none are" in messages.pop()  # no hub id is allowed


def test_dot_dot_names_never_reach_transformers(monkeypatch, tmp_path):
    import conspo.models.loading as models

    def forbidden(*args, **kwargs):
        raise AssertionError(f"transformers was asked to load {args[0]!r}")

    for loader in (models.AutoTokenizer, models.AutoModelForCausalLM, models.AutoConfig):
        monkeypatch.setattr(loader, "from_pretrained", forbidden)
    bounded = builtin_store(tmp_path, ModelSources(roots=(tmp_path,), hub_allow=()))
    unbounded = builtin_store(tmp_path)  # the library's default: any directory, any hub id
    for store in (bounded, unbounded):
        for name in ("../../..", "..", "../", "./", "/"):
            with pytest.raises(Unavailable, match="model.name"):
                load_policy(ModelConfig(name=name, device="cpu"), store)


def test_an_allowed_hub_id_not_in_the_cache_fails_offline_without_a_download(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # a download attempt would not work
    store = builtin_store(tmp_path, ModelSources(roots=(tmp_path,), hub_allow=("conspo-test/*",)))
    with pytest.raises(Unavailable, match="HF_HUB_OFFLINE=1 forbids downloading it"):
        load_policy(ModelConfig(name="conspo-test/not-cached", device="cpu"), store)
    with pytest.raises(Unavailable, match="a hub id the operator allows \\(conspo-test/\\*\\)"):
        load_policy(ModelConfig(name="conspo-other/not-cached", device="cpu"), store)
