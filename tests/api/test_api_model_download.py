"""A model downloads: ``GET /api/runs/{id}/export`` streams a tar of the exported directory, which
loads with ``AutoModelForCausalLM.from_pretrained`` once extracted, under the export's own rules
(its owner or an admin; a model trained from another user's unshared run is that user's too).
It is resumable (a Range of it is those bytes of the whole) and carries its SHA-256, which
``Client.fetch_model`` / ``conspo-lab models download`` check after going on from dropped
connections. The runs train for real, in this process, with the worker's code (tiny model, 2
steps); the dropped connections are real TCP connections closed mid-answer by a proxy."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import random
import re
import socket
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
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


def test_the_archive_sends_any_span_of_itself_read_from_that_offset(tmp_path: Path) -> None:
    """chunks(start, end) is the whole archive's bytes [start, end): at member boundaries, inside
    headers, files and padding; a file wholly before start is not read."""
    root = tmp_path / "model"
    root.mkdir()
    (root / "a.bin").write_bytes(random.Random(0).randbytes(2 * READ_BYTES + 333))
    (root / "b.json").write_text('{"x": 1}')
    archive = ModelTar(root, "top")
    whole = b"".join(archive.chunks())
    rng = random.Random(1)
    spans = [(0, archive.size), (archive.size, archive.size), (511, 513), (1023, 1025)]
    spans += [tuple(sorted(rng.sample(range(archive.size + 1), 2))) for _ in range(200)]
    for start, end in spans:
        assert b"".join(archive.chunks(start, end)) == whole[start:end], (start, end)
    assert archive.sha256() == hashlib.sha256(whole).hexdigest()
    (root / "a.bin").unlink()  # a span past it never opens it
    tail = archive.size - 2048
    assert b"".join(archive.chunks(tail)) == whole[tail:]
    with pytest.raises(ValueError):
        list(archive.chunks(5, 4))


def _sha256_of(r: Any) -> str:
    """The hex SHA-256 of a response's ``Repr-Digest: sha-256=:<base64>:``."""
    match = re.fullmatch(r"sha-256=:([A-Za-z0-9+/=]+):", r.headers["repr-digest"])
    assert match, r.headers["repr-digest"]
    return base64.b64decode(match[1]).hex()


def test_a_range_of_the_download_is_those_bytes_of_the_whole_and_it_carries_its_sha256(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_id = train_as(api, "alice", tiny_config(2))["id"]
    exported = api.post(f"/api/models/{run_id}/export", json={"step": "last"}).json()
    url = f"/api/runs/{run_id}/export"
    whole = api.get(url, user="alice")
    assert whole.status_code == 200, whole.text
    body = whole.content
    size, sha256 = len(body), hashlib.sha256(body).hexdigest()
    assert (exported["size"], exported["sha256"]) == (size, sha256)
    assert whole.headers["accept-ranges"] == "bytes"
    assert _sha256_of(whole) == sha256 and whole.headers["etag"] == f'"{sha256}"'

    def part(spec: str, user: str | None = "alice", **headers: str) -> Any:
        return api.get(url, user=user, headers={"Range": spec, **headers})

    r = part("bytes=100-4099")
    assert r.status_code == 206, r.text
    assert r.content == body[100:4100]
    assert r.headers["content-range"] == f"bytes 100-4099/{size}"
    assert int(r.headers["content-length"]) == 4000
    assert _sha256_of(r) == sha256  # the whole tar's, on a part of it too
    # two ranges stitched are the whole, split anywhere (here inside a file's bytes)
    cut = size * 2 // 3
    first, rest = part(f"bytes=0-{cut - 1}"), part(f"bytes={cut}-")
    assert (first.status_code, rest.status_code) == (206, 206)
    assert first.content + rest.content == body
    assert part("bytes=-700").content == body[-700:]  # the last 700
    assert part(f"bytes={size - 10}-{size + 500}").content == body[-10:]  # clamped to the end
    # past the end: 416 saying the size
    for spec in (f"bytes={size}-", f"bytes={size + 7}-{size + 9}", "bytes=-0"):
        r = part(spec)
        assert r.status_code == 416, (spec, r.text)
        assert r.headers["content-range"] == f"bytes */{size}"
        assert "Range" in r.json()["detail"] and str(size) in r.json()["detail"]
    # several spans, another unit, not the syntax: the whole (RFC 9110 lets a server)
    for spec in ("bytes=0-9,20-29", "items=0-9", "bytes=9-2", "bytes=x-"):
        r = part(spec)
        assert r.status_code == 200 and r.content == body, spec
    # If-Range: the range while the tar is that one, else the whole
    assert part("bytes=10-19", **{"If-Range": f'"{sha256}"'}).content == body[10:20]
    stale = part("bytes=10-19", **{"If-Range": '"0000"'})
    assert stale.status_code == 200 and stale.content == body
    # a browser resuming through the export's download_url (a ticket, no token)
    r = api.get(exported["download_url"], headers={"Range": "bytes=5-"})
    assert r.status_code == 206 and r.content == body[5:]

    # the checksum is kept beside the export: a second download does not read the tar again...
    directory = Path(exported["path"])
    kept = directory.with_name(f"{directory.name}.tar.sha256")
    assert sha256 in kept.read_text()

    def no_hashing(self: ModelTar) -> str:
        raise AssertionError("the tar was hashed again")

    with monkeypatch.context() as m:
        m.setattr(ModelTar, "sha256", no_hashing)
        assert _sha256_of(api.get(url, user="alice")) == sha256
        assert api.post(f"/api/models/{run_id}/export", json={"step": "last"}).status_code == 200
    # ...until the directory changes (a file rewritten: its mtime is in the tar)
    config = directory / "config.json"
    os.utime(config, (config.stat().st_atime, config.stat().st_mtime + 60))
    changed = api.get(url, user="alice")
    assert _sha256_of(changed) == hashlib.sha256(changed.content).hexdigest() != sha256


class CuttingProxy:
    """A TCP proxy in front of a server that closes its ``i``-th connection, both ways as a
    dropped network link would, once it has passed ``cuts[i]`` bytes of answers; later
    connections pass whole. ``ranges`` lists the Range headers of the requests it saw."""

    def __init__(self, upstream: str, cuts: list[int]) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.cuts = list(cuts)
        self.ranges: list[str | None] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            budget = self.cuts.pop(0) if self.cuts else None
            server = socket.create_connection(self.upstream)
            threading.Thread(target=self._up, args=(client, server), daemon=True).start()
            args = (server, client, budget)
            threading.Thread(target=self._down, args=args, daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket) -> None:
        try:
            while data := client.recv(65536):
                for head in re.findall(rb"GET [^\r]*\r\n(?:[^\r]+\r\n)*", data):
                    found = re.search(rb"(?im)^range: *([^\r]+)", head)
                    self.ranges.append(found[1].decode() if found else None)
                server.sendall(data)
        except OSError:
            pass

    def _down(self, server: socket.socket, client: socket.socket, budget: int | None) -> None:
        try:
            while data := server.recv(65536):
                if budget is not None and len(data) >= budget:
                    client.sendall(data[:budget])
                    break  # the link drops
                client.sendall(data)
                budget = None if budget is None else budget - len(data)
        except OSError:
            pass
        for sock in (client, server):
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self.listener.close()


@contextmanager
def cutting_proxy(upstream: str, cuts: list[int]) -> Iterator[CuttingProxy]:
    proxy = CuttingProxy(upstream, cuts)
    try:
        yield proxy
    finally:
        proxy.close()


def _logits(directory: Path | str) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    ids = torch.arange(12)[None] % model.config.vocab_size
    with torch.no_grad():
        return model(ids).logits


def test_a_dropped_download_goes_on_with_a_range_and_the_model_it_unpacks_loads(
    api: Api, tmp_path: Path
) -> None:
    """Two dropped connections (a third and two thirds in): the client asks for the rest with a
    Range each time, checks the SHA-256, and the directory it unpacks loads elsewhere and
    computes the same logits as the export on the server."""
    from conspo_lab.client import ChecksumMismatch, Client, ServerUnavailable

    run_id = train_as(api, "alice", tiny_config(2))["id"]
    exported = api.post(f"/api/models/{run_id}/export", json={"step": "last"}).json()
    size, name = exported["size"], Path(exported["path"]).name
    into = tmp_path / "downloads"
    with live_server(api.settings, PORTS) as url:
        with (
            cutting_proxy(url, [size // 3, size // 3]) as proxy,
            Client(proxy.url, api.tokens["alice"]) as lab,
        ):
            got = lab.fetch_model(run_id, into, retry_wait=0.05)
        assert got.resumes == 2 and got.size == size and got.sha256 == exported["sha256"]
        starts = [int(r.split("=")[1].rstrip("-")) for r in proxy.ranges if r]
        assert len(starts) == 2 and 0 < starts[0] < starts[1] < size, proxy.ranges
        assert got.path == into / name and not (into / f".{name}.tar.part").exists()
        elsewhere = tmp_path / "elsewhere"
        got.path.rename(elsewhere)
        assert torch.equal(_logits(elsewhere), _logits(exported["path"]))

        # a corrupted partial file: found by the checksum, said, and deleted
        with (
            cutting_proxy(url, [size // 2]) as proxy,
            Client(proxy.url, api.tokens["alice"]) as lab,
            pytest.raises(ServerUnavailable, match="go on from"),
        ):
            lab.fetch_model(run_id, into, retries=0)
        part = into / f".{name}.tar.part"
        data = bytearray(part.read_bytes())
        assert 0 < len(data) < size
        data[len(data) // 2] ^= 0xFF
        part.write_bytes(bytes(data))
        with Client(url, api.tokens["alice"]) as lab:
            with pytest.raises(ChecksumMismatch, match="SHA-256") as raised:
                lab.fetch_model(run_id, into)
            assert exported["sha256"] in str(raised.value), raised.value
            assert not part.exists()
            # the next try starts over, and is whole
            assert lab.download_model(run_id, into) == into / name
        assert torch.equal(_logits(into / name), _logits(exported["path"]))


class WithoutRanges(httpx.HTTPTransport):
    """A way to a server that ignores Range (answers 200 with the whole)."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if "Range" in request.headers:
            self.dropped.append(request.headers.pop("Range"))
        return super().handle_request(request)


def test_a_server_answering_the_whole_to_a_range_is_read_from_the_start(
    api: Api, tmp_path: Path
) -> None:
    from conspo_lab.client import Client

    run_id = train_as(api, "alice", tiny_config(2))["id"]
    exported = api.post(f"/api/models/{run_id}/export", json={"step": "last"}).json()
    name = Path(exported["path"]).name
    (tmp_path / f".{name}.tar.part").write_bytes(b"x" * 5000)  # not what the tar starts with
    transport = WithoutRanges()
    with (
        live_server(api.settings, PORTS) as url,
        Client(url, api.tokens["alice"], transport=transport) as lab,
    ):
        got = lab.fetch_model(run_id, tmp_path)
    assert transport.dropped == ["bytes=5000-"]  # it asked to go on; the server sent the whole
    assert got.resumes == 0 and got.sha256 == exported["sha256"]
    assert torch.equal(_logits(got.path), _logits(exported["path"]))


def test_conspo_lab_models_download_writes_a_loadable_directory_and_prints_its_checksum(
    api: Api, tmp_path: Path
) -> None:
    from typer.testing import CliRunner

    from conspo_lab.cli import app

    run_id = train_as(api, "alice", tiny_config(2))["id"]
    exported = api.post(f"/api/models/{run_id}/export", json={"step": "last"}).json()
    into = tmp_path / "models"
    with live_server(api.settings, PORTS) as url:
        auth = ["--url", url, "--token", api.tokens["alice"]]
        args = ["models", "download", str(run_id), "--into", str(into), *auth]
        done = CliRunner().invoke(app, args)
        assert done.exit_code == 0, done.output
        missing = CliRunner().invoke(app, ["models", "download", str(run_id + 1000), *auth])
        assert missing.exit_code == 2, missing.output
        bob = CliRunner().invoke(app, [*args[:-1], api.tokens["bob"]])
        assert bob.exit_code == 2 and "403" in bob.output, bob.output
    local = into / f"run-{run_id}-2"
    printed = "".join(done.output.split())  # rich may wrap the path
    assert str(local.resolve()) in printed and exported["sha256"] in printed, done.output
    assert torch.equal(_logits(local), _logits(exported["path"]))
    message = " ".join(missing.output.split())
    assert "error:" in message and "404" in message and f"run {run_id + 1000}" in message, message
