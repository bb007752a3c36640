"""Corpora over HTTP (app/corpora.py) on the CPU backend: upload of any bytes as the raw
body (with and without Content-Length, streamed to disk block by block), list, get,
delete, the size limit, auth, a restart on the same data directory, Idempotency-Key (one
corpus per key, across restarts and concurrent retries) and storage faults that leave no
file behind (more in test_storage_faults.py)."""

from __future__ import annotations

import hashlib
import os
import socket
import sys
import time

import httpx
import numpy as np
import pytest
from pencil_testkit import admin_client, assert_api_error, free_port, server_env, server_process

import jobs.corpora
from jobs.runner import JobRunner
from jobs.storage import create_owned, creating_owned

TOKEN = "corpora-test-token"


def admin(make_client, **overrides):
    return admin_client(make_client, TOKEN, **overrides)


def corpus_dir(client):
    return client.app.state.settings.data_dir / "corpora"


def upload(client, data, name: str | None = "test") -> dict:
    response = client.post("/corpora", params={"name": name} if name is not None else None, content=data)
    assert response.status_code == 201, response.text
    body = response.json()
    assert response.headers["location"] == f"/corpora/{body['id']}" == body["url"]
    return body


def chunks(data: bytes, size: int):
    """A body without Content-Length (chunked), `size` bytes a chunk."""
    for start in range(0, len(data), size):
        yield data[start : start + size]


def test_upload_stores_any_bytes_exactly(make_client, rng):
    client = admin(make_client)
    data = rng.integers(0, 256, 300_001, dtype=np.uint8).tobytes() + bytes(range(256)) + b"\0\0\n\r\n"
    body = upload(client, data, name="binary + NULs")
    assert body["bytes"] == len(data)
    assert body["sha256"] == hashlib.sha256(data).hexdigest()
    assert body["newlines"] == data.count(b"\n")
    assert body["name"] == "binary + NULs" and body["resident_on"] == []
    assert (corpus_dir(client) / f"{body['id']}.bin").read_bytes() == data
    assert client.get(f"/corpora/{body['id']}").json() == body


def test_a_chunked_body_is_written_to_disk_as_it_arrives(make_client, rng, monkeypatch):
    """Driven through ASGI directly (the TestClient reads a streamed body whole before
    the app sees it): halfway through the body, its first half is already on disk."""
    monkeypatch.setattr(jobs.corpora, "FLUSH_BYTES", 4096)
    client = admin(make_client)
    data = rng.integers(0, 256, 100_000, dtype=np.uint8).tobytes()
    pieces = list(chunks(data, 1000))
    on_disk_halfway, sent, messages = [], [], []

    async def receive():
        if len(sent) == len(pieces) // 2:
            on_disk_halfway.append(sum(p.stat().st_size for p in corpus_dir(client).glob(".*.partial")))
        if len(sent) < len(pieces):
            sent.append(pieces[len(sent)])
            return {"type": "http.request", "body": sent[-1], "more_body": len(sent) < len(pieces)}
        return {"type": "http.disconnect"}

    async def send(message):
        messages.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/corpora",
        "raw_path": b"/corpora",
        "query_string": b"",
        "root_path": "",
        "state": {},
        "headers": [
            (b"host", b"testserver"),
            (b"authorization", f"Bearer {TOKEN}".encode()),
            (b"transfer-encoding", b"chunked"),
        ],
        "client": ("testclient", 50000),
        "server": ("testserver", 80),
    }
    client.portal.call(client.app, scope, receive, send)
    assert messages[0]["status"] == 201, messages
    assert on_disk_halfway and 50_000 - 4096 - 1000 <= on_disk_halfway[0] <= 50_000, on_disk_halfway
    stored = client.get("/corpora").json()["corpora"][0]
    assert stored["name"] is None and stored["bytes"] == len(data)
    assert (corpus_dir(client) / f"{stored['id']}.bin").read_bytes() == data
    assert not list(corpus_dir(client).glob(".*"))  # no partial file left


def test_list_is_newest_first_and_get_and_delete(make_client):
    client = admin(make_client)
    first = upload(client, b"first corpus\n", name="a")
    second = upload(client, b"second one", name="b")
    listing = client.get("/corpora").json()
    assert [c["id"] for c in listing["corpora"]] == [second["id"], first["id"]]
    assert listing["total_bytes"] == 13 + 10
    response = client.delete(f"/corpora/{first['id']}")
    assert response.status_code == 200, response.text
    assert response.json()["deleted"] is True and response.json()["id"] == first["id"]
    assert_api_error(client.get(f"/corpora/{first['id']}"), 404, "corpus_not_found")
    assert_api_error(client.delete(f"/corpora/{first['id']}"), 404, "corpus_not_found")
    assert [c["id"] for c in client.get("/corpora").json()["corpora"]] == [second["id"]]
    assert sorted(p.name for p in corpus_dir(client).iterdir()) == sorted(
        [f"{second['id']}.bin", f"{second['id']}.json"]
    )


@pytest.mark.parametrize("corpus_id", ["0" * 32, "nope", "..jobs.sqlite3", "A" * 32, "0" * 33])
def test_unknown_corpus_ids_are_404(make_client, corpus_id):
    client = admin(make_client)
    assert_api_error(client.get(f"/corpora/{corpus_id}"), 404, "corpus_not_found", client)
    assert_api_error(client.delete(f"/corpora/{corpus_id}"), 404, "corpus_not_found", client)


@pytest.mark.parametrize("chunked", [False, True])
def test_a_corpus_over_the_limit_is_413_and_leaves_nothing(make_client, chunked):
    client = admin(make_client, max_corpus_bytes=10_000)
    data = b"x" * 10_001
    response = client.post("/corpora", content=chunks(data, 999) if chunked else data)
    assert_api_error(response, 413, "too_large", client)
    assert "PENCIL_MAX_CORPUS_BYTES" in response.json()["detail"]
    assert client.get("/corpora").json()["corpora"] == []
    assert not list(corpus_dir(client).glob("*")) if corpus_dir(client).exists() else True
    assert upload(client, data[:10_000])["bytes"] == 10_000  # exactly the limit is fine


def test_a_declared_length_far_over_the_limit_is_refused_before_the_body_naming_its_setting(make_client):
    """Past the limit plus the multipart allowance the middleware answers from Content-Length;
    the 413 names the setting of the path (corpora, jobs), not the image upload limit."""
    client = admin(make_client, max_corpus_bytes=1000, max_job_upload_bytes=2000)
    response = client.post("/corpora", content=b"x" * 71_000)
    assert_api_error(response, 413, "too_large", client)
    assert "PENCIL_MAX_CORPUS_BYTES" in response.json()["detail"]
    response = client.post("/jobs/svd", content=b"x" * 72_000, headers={"Content-Type": "application/octet-stream"})
    assert_api_error(response, 413, "too_large", client)
    assert "PENCIL_MAX_JOB_UPLOAD_BYTES" in response.json()["detail"]


def test_corpora_have_their_own_body_limit(make_client):
    """The image upload limit (1 KiB here) does not apply to /corpora, nor the corpus limit to /sketch."""
    client = admin(make_client, max_upload_bytes=1024, max_corpus_bytes=1_000_000)
    assert upload(client, b"y" * 500_000)["bytes"] == 500_000
    assert client.app.state.settings.upload_limit("/corpora") == 1_000_000
    assert client.app.state.settings.upload_limit("/corpora/abc") == 1_000_000
    assert client.app.state.settings.upload_limit("/sketch") == 1024


def test_bad_uploads(make_client):
    client = admin(make_client)
    assert_api_error(client.post("/corpora", content=b""), 400, "empty_corpus", client)
    assert_api_error(
        client.post("/corpora", files={"file": ("a.txt", b"hello")}), 415, "unsupported_media_type", client
    )
    assert_api_error(client.post("/corpora", params={"name": "   "}, content=b"abc"), 422, "invalid_parameter", client)
    assert_api_error(
        client.post("/corpora", params={"name": "a\x01b"}, content=b"abc"), 422, "invalid_parameter", client
    )
    assert_api_error(
        client.post("/corpora", params={"name": "n" * 201}, content=b"abc"), 422, "invalid_parameter", client
    )
    assert client.get("/corpora").json()["corpora"] == []


def test_corpora_need_the_admin_token(make_client):
    client = make_client(admin_token=None)
    assert_api_error(client.post("/corpora", content=b"abc"), 503, "admin_disabled")
    assert_api_error(client.get("/corpora"), 503, "admin_disabled")
    client = make_client(admin_token=TOKEN)
    for response in (
        client.post("/corpora", content=b"abc"),
        client.get("/corpora", headers={"Authorization": f"Bearer {TOKEN}x"}),
        client.get(f"/corpora/{'0' * 32}"),
        client.delete(f"/corpora/{'0' * 32}", headers={"Authorization": "Basic abc"}),
    ):
        assert_api_error(response, 401, "unauthorized")
    assert not corpus_dir(client).exists() or not list(corpus_dir(client).iterdir())


def test_corpora_survive_a_restart_and_debris_is_removed(make_client, tmp_path):
    client = admin(make_client)
    kept = upload(client, b"survives a restart\n" * 100, name="kept")
    folder = corpus_dir(client)
    client.__exit__(None, None, None)
    (folder / ".0123456789abcdef0123456789abcdef.partial").write_bytes(b"interrupted upload")
    (folder / f"{'f' * 32}.bin").write_bytes(b"text whose metadata was never written")
    (folder / f"{'e' * 32}.json").write_text('{"id": "' + "e" * 32 + '"}')
    (folder / "notes.txt").write_text("not ours: left alone")
    two_hours_ago = time.time() - 7200
    for path in folder.iterdir():
        os.utime(path, (two_hours_ago, two_hours_ago))
    # A moment ago, by a process killed since (its lock went with it): removed at once.
    (folder / ".cccccccccccccccccccccccccccccccc.partial").write_bytes(b"")
    # Another server process's upload in progress: it holds the file's lock.
    with creating_owned(folder):
        owner = create_owned(folder / ".abcdefabcdefabcdefabcdefabcdefab.partial")
    try:
        client = admin(make_client)
        assert client.get("/corpora").json()["corpora"] == [kept]
        assert sorted(p.name for p in folder.iterdir()) == sorted(
            [f"{kept['id']}.bin", f"{kept['id']}.json", "notes.txt", ".abcdefabcdefabcdefabcdefabcdefab.partial"]
        )
    finally:
        os.close(owner)


def test_a_cut_upload_leaves_nothing_and_a_killed_uploads_partial_goes_at_a_quick_restart(tmp_path):
    """Against `pencil-gpu serve`: a client that stops mid-upload leaves no partial file; a
    server killed (SIGKILL) mid-upload leaves one, which the next start removes at once."""
    port = free_port()
    env = server_env(tmp_path, port=str(port), admin_token=TOKEN)
    base = f"http://127.0.0.1:{port}"
    folder = tmp_path / "data" / "corpora"
    head = (
        f"POST /corpora HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 10000000\r\n\r\n"
    ).encode()

    def partials() -> list[str]:
        return [p.name for p in folder.glob(".*.partial")] if folder.is_dir() else []

    def cut_upload(kill=None) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(head + b"some text\n" * 100)
            deadline = time.monotonic() + 10
            while not partials() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert partials(), "the upload's partial file never appeared"
            if kill is not None:
                kill()

    with server_process([sys.executable, "-m", "app.cli", "serve"], tmp_path, env, base):
        cut_upload()
        deadline = time.monotonic() + 10
        while partials() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert partials() == []
    with server_process([sys.executable, "-m", "app.cli", "serve"], tmp_path, env, base) as server:
        cut_upload(kill=lambda: (server.kill(), server.wait()))
        assert len(partials()) == 1  # nothing ran to remove it
    with server_process([sys.executable, "-m", "app.cli", "serve"], tmp_path, env, base):
        assert partials() == []  # the restart removed it at once
        assert httpx.get(f"{base}/corpora", headers={"Authorization": f"Bearer {TOKEN}"}).json()["corpora"] == []


def test_a_corpus_in_use_by_a_queued_search_cannot_be_deleted(make_client, monkeypatch):
    monkeypatch.setattr(JobRunner, "_work", lambda self: None)  # jobs stay queued
    client = admin(make_client)
    corpus = upload(client, b"the text of the corpus")
    response = client.post("/jobs/search", json={"corpus_id": corpus["id"], "patterns": ["the"]})
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    response = client.delete(f"/corpora/{corpus['id']}")
    assert_api_error(response, 409, "corpus_in_use", client)
    assert job_id in response.json()["detail"]
    assert client.delete(f"/jobs/{job_id}").status_code == 200  # canceled while queued
    assert client.delete(f"/corpora/{corpus['id']}").status_code == 200


def test_a_search_submitted_while_its_corpus_is_deleted_is_refused_or_blocks_the_delete(make_client, monkeypatch):
    """DELETE checks for searches and unlists the corpus with no await in between: a search
    posted while the (slow) removal of the text runs gets 404, never a 202 for a corpus the
    DELETE then removes."""
    import asyncio
    import time

    import httpx

    monkeypatch.setattr(JobRunner, "_work", lambda self: None)  # jobs stay queued
    client = admin(make_client)
    corpus = upload(client, b"hello needle world\n" * 100)
    remove_text = jobs.corpora.CorpusStore.remove_text

    def slow_remove_text(self, corpus_id):  # a slow disk: the text's removal takes a while
        time.sleep(0.3)
        remove_text(self, corpus_id)

    monkeypatch.setattr(jobs.corpora.CorpusStore, "remove_text", slow_remove_text)
    headers = {"Authorization": f"Bearer {TOKEN}"}

    async def delete_and_search():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=client.app), base_url="http://test") as http:
            delete = asyncio.create_task(http.delete(f"/corpora/{corpus['id']}", headers=headers))
            await asyncio.sleep(0.05)
            search = await http.post(
                "/jobs/search", json={"corpus_id": corpus["id"], "patterns": ["needle"]}, headers=headers
            )
            return await delete, search

    deleted, search = asyncio.run(delete_and_search())
    assert deleted.status_code == 200, deleted.text
    assert_api_error(search, 404, "corpus_not_found", client)
    assert client.get("/jobs", params={"kind": "search"}).json()["jobs"] == []
    assert not list(corpus_dir(client).glob(f"{corpus['id']}*"))


# ---------------------------------------------------------- idempotency --


def keyed(client, data: bytes, key: str, name: str | None = "test"):
    return client.post(
        "/corpora", params={"name": name} if name is not None else None, content=data, headers={"Idempotency-Key": key}
    )


def test_idempotency_key_stores_a_corpus_once_even_across_a_restart(make_client):
    """The answer of a stored corpus was lost: the retry gets it, and nothing is stored twice."""
    client = admin(make_client)
    first = keyed(client, b"the text\n" * 10, "upload-1")
    assert first.status_code == 201, first.text
    again = keyed(client, b"the text\n" * 10, "upload-1")
    assert again.status_code == 200 and again.json() == first.json()
    assert again.headers["location"] == f"/corpora/{first.json()['id']}"
    assert "idempotency_key" not in first.json() and "request_digest" not in first.json()
    for response in (keyed(client, b"another text", "upload-1"), keyed(client, b"the text\n" * 10, "upload-1", "b")):
        body = assert_api_error(response, 409, "idempotency_conflict", client)
        assert first.json()["id"] in body["detail"]
    other = keyed(client, b"the text\n" * 10, "upload-2")
    assert other.status_code == 201 and other.json()["id"] != first.json()["id"]
    client.__exit__(None, None, None)
    client = admin(make_client)
    assert keyed(client, b"the text\n" * 10, "upload-1").json() == first.json()
    assert sorted(c["id"] for c in client.get("/corpora").json()["corpora"]) == sorted(
        [first.json()["id"], other.json()["id"]]
    )
    assert not list(corpus_dir(client).glob(".*.partial")) and len(list(corpus_dir(client).glob("*.bin"))) == 2


def test_concurrent_uploads_with_one_key_store_one_corpus(make_client):
    import asyncio

    import httpx

    client = admin(make_client)
    headers = {"Authorization": f"Bearer {TOKEN}", "Idempotency-Key": "same"}

    async def post_all():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=client.app), base_url="http://test") as http:
            return await asyncio.gather(
                *(http.post("/corpora", content=b"racing text", headers=headers) for _ in range(6))
            )

    responses = asyncio.run(post_all())
    assert sorted(r.status_code for r in responses) == [200] * 5 + [201]
    assert len({r.json()["id"] for r in responses}) == 1
    assert len(client.get("/corpora").json()["corpora"]) == 1


def test_a_bad_idempotency_key_is_400(make_client):
    client = admin(make_client)
    assert_api_error(keyed(client, b"text", "k" * 201), 400, "bad_idempotency_key")


def test_metadata_that_cannot_be_written_leaves_neither_text_nor_partial(make_client, monkeypatch):
    """The text is in place, then its metadata fails (a full disk): 507, and the text goes too."""
    import errno

    def full_disk(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    client = admin(make_client)
    monkeypatch.setattr(jobs.corpora, "write_atomically", full_disk)
    response = client.post("/corpora", content=b"text that will not be kept")
    body = assert_api_error(response, 507, "insufficient_storage", client)
    assert body["detail"].startswith("could not store the corpus: No space left on device")
    assert "retry-after" not in response.headers
    assert list(corpus_dir(client).iterdir()) == []
