"""A model downloads: ``GET /api/runs/{id}/export`` streams a tar of the exported directory, which
loads with ``AutoModelForCausalLM.from_pretrained`` once extracted, under the export's own rules
(its owner or an admin; a model trained from another user's unshared run is that user's too).
The runs train for real, in this process, with the worker's code (tiny model, 2 steps)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
import torch

from conspo.models.model_tar import READ_BYTES, ModelTar
from tests.api.conftest import Api, live_server, tiny_config
from tests.api.test_api_shared_models import from_run, share, train_as

pytestmark = pytest.mark.services

PORTS = range(18660, 18700)


@pytest.fixture
def api(own_api: Api) -> Api:
    """A database and data dir of its own: the exports written here stay out of the session's."""
    return own_api


def test_a_runs_model_downloads_as_a_tar_that_loads_with_from_pretrained(
    api: Api, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    run = train_as(api, "alice", tiny_config(2))
    r = api.get(f"/api/runs/{run['id']}/export", user="alice")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/x-tar"
    # the directory the export wrote on the server, named by the checkpoint's step
    exported = api.post(f"/api/models/{run['id']}/export", json={"step": "last"}).json()["path"]
    name = Path(exported).name
    assert name == f"run-{run['id']}-2"
    assert r.headers["content-disposition"] == f'attachment; filename="{name}.tar"'
    assert int(r.headers["content-length"]) == len(r.content)
    with tarfile.open(fileobj=io.BytesIO(r.content)) as archive:
        assert {m.name.split("/")[0] for m in archive.getmembers()} == {name}
        archive.extractall(tmp_path, filter="data")
    downloaded = AutoModelForCausalLM.from_pretrained(tmp_path / name)
    # the same weights as that directory
    on_server = AutoModelForCausalLM.from_pretrained(exported).state_dict()
    for key, value in downloaded.state_dict().items():
        assert torch.equal(value, on_server[key]), key
    # a checkpoint the run does not have (it kept no best)
    r = api.get(f"/api/runs/{run['id']}/export?step=best", user="alice")
    assert r.status_code == 404 and "best" in r.json()["detail"], r.text
    assert api.get(f"/api/runs/{run['id']}/export?step=soon", user="alice").status_code == 422


def test_a_download_follows_the_export_rules(api: Api) -> None:
    source = train_as(api, "alice", tiny_config(2))["id"]
    missing = source + 1000
    assert api.get(f"/api/runs/{missing}/export", user="alice").status_code == 404
    assert api.get(f"/api/runs/{source}/export").status_code == 401  # no token
    # another user's run: its owner's to export, shared or not (it writes to the server's disk)
    r = api.get(f"/api/runs/{source}/export", user="bob")
    assert r.status_code == 403 and r.headers["content-type"] == "application/json", r.text
    assert share(api, source, True).status_code == 200
    derived = train_as(api, "bob", from_run(source))["id"]
    assert share(api, source, False).status_code == 200
    # bob's own run, trained from alice's now unshared one: refused naming hers
    r = api.get(f"/api/runs/{derived}/export", user="bob")
    assert r.status_code == 403 and f"trained from run {source}" in r.json()["detail"], r.text
    assert api.get(f"/api/runs/{derived}/export", user="root").status_code == 200  # an admin


def test_the_exports_download_url_is_a_link_a_browser_follows_without_a_token(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Models page navigates to it (a plain link sends no Authorization header): its ticket
    stands for alice's token, for that run and step only, until it expires or her token goes."""
    from sqlalchemy import select

    from backend import security
    from backend.db import Database
    from backend.models import ApiToken

    mine = train_as(api, "alice", tiny_config(2))["id"]
    theirs = train_as(api, "bob", tiny_config(2))["id"]
    url = api.post(f"/api/models/{mine}/export", json={"step": "last"}).json()["download_url"]
    assert url.startswith(f"/api/runs/{mine}/export?step=last&ticket=")
    r = api.get(url)  # no token
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-tar", r.text
    assert r.headers["content-disposition"] == f'attachment; filename="run-{mine}-2.tar"'
    # another step, another run (bob's, which alice could not export either), a changed signature
    refused = [
        url.replace("step=last", "step=2"),
        url.replace(f"/runs/{mine}/", f"/runs/{theirs}/"),
        url[:-1] + ("0" if url[-1] != "0" else "1"),
        url.split("&ticket=")[0] + "&ticket=1.2.x",
    ]
    for other in refused:
        r = api.get(other)
        assert r.status_code == 401 and "invalid or expired" in r.json()["detail"], (other, r.text)
    # expired: as if the clock had gone on past its lifetime
    later = security.time.time() + security.TICKET_TTL_S + 5
    with monkeypatch.context() as m:
        m.setattr(security, "time", type("Clock", (), {"time": staticmethod(lambda: later)}))
        assert api.get(url).status_code == 401
    assert api.get(url).status_code == 200
    # alice's token revoked: the links it signed die with it
    db = Database(api.settings)
    try:
        with db.session() as session:
            row = session.scalar(
                select(ApiToken).where(
                    ApiToken.token_hash == security.hash_token(api.tokens["alice"])
                )
            )
            assert row is not None
            row.revoked = True
            session.commit()
    finally:
        db.dispose()
    assert api.get(url).status_code == 401


def test_the_archive_is_sent_a_block_at_a_time_and_its_size_is_known_first(
    tmp_path: Path,
) -> None:
    """No chunk holds more than one read of one file: the archive is never built in memory."""
    root = tmp_path / "model"
    (root / "sub").mkdir(parents=True)
    (root / "weights.bin").write_bytes(bytes(range(256)) * (3 * READ_BYTES // 256 + 7))
    (root / "sub" / "config.json").write_text("{}")
    (root / "empty").write_bytes(b"")
    archive = ModelTar(root, "top")
    chunks = list(archive.chunks())
    assert max(len(c) for c in chunks) <= READ_BYTES
    data = b"".join(chunks)
    assert len(data) == archive.size
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert tar.getnames() == ["top/empty", "top/sub", "top/sub/config.json", "top/weights.bin"]
        extracted = tar.extractfile("top/weights.bin")
        assert extracted is not None
        assert extracted.read() == (root / "weights.bin").read_bytes()


def test_the_cli_downloads_a_model_over_http_unpacked_as_it_streams(
    api: Api, tmp_path: Path
) -> None:
    """``conspo-lab models export RUN --download DIR`` against a real HTTP server."""
    from transformers import AutoModelForCausalLM
    from typer.testing import CliRunner

    from conspo_lab.cli import app

    run_id = train_as(api, "alice", tiny_config(2))["id"]
    with live_server(api.settings, PORTS) as url:
        args = ["models", "export", str(run_id), "--download", str(tmp_path), "--url", url]
        done = CliRunner().invoke(app, [*args, "--token", api.tokens["alice"]])
        assert done.exit_code == 0, done.output
        refused = CliRunner().invoke(app, [*args, "--token", api.tokens["bob"]])
        assert refused.exit_code != 0 and "403" in refused.output, refused.output
    local = tmp_path / f"run-{run_id}-2"
    assert str(local) in "".join(done.output.split())  # rich may wrap the path
    AutoModelForCausalLM.from_pretrained(local)
