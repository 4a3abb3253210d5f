"""The service's bounds against slow readers, queued batches and many checkpoints (issue 26): each
attack performed against a real server on loopback (uvicorn with the service's protocol, in a thread)
or through the app, and the bound checked where it holds."""

from __future__ import annotations

import asyncio
import gc
import json
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pytest
from fastapi.testclient import TestClient

from cropi_service.api.app import create_app
from cropi_service.api.connections import guarded_protocol
from cropi_service.base.errors import BusyError, OverloadedError
from cropi_service.base.settings import ServiceSettings
from cropi_service.domain.cache import VersionedCache
from cropi_service.domain.flight import AnswerLedger, Slots
from cropi_service.domain.registry import CheckpointRow, Registry, new_id
from cropi_service.domain.service import scoring_key
from cropi_service.domain.views import GradientView
from cropi_service.entry.cli import server_config
from cropi_service.jobs.table import JobStore
from support.service import AUTH, KINDS, TOKEN, Env, FakeCheckpoint, FakeGradients, FakeLibrary, make_settings

OTHER = "second-caller-token-9876543210"
ARROW = "application/vnd.apache.arrow.stream"
MB = 2**20


# the primitives

def test_a_batch_waiting_for_its_turn_holds_no_thread_and_turns_go_first_come_first_served():
    slots = Slots(1)
    order = []

    async def main():
        assert await slots.acquire(1.0)  # the one slot, taken
        threads = threading.active_count()

        async def wait(i):
            got = await slots.acquire(5.0)
            order.append(i)
            await asyncio.sleep(0.01)
            slots.release()
            return got

        waiters = [asyncio.create_task(wait(i)) for i in range(50)]
        await asyncio.sleep(0.1)
        assert slots.waiting == 50 and threading.active_count() == threads  # 50 waiting, no thread each
        assert await slots.acquire(0.05, max_waiting=50) is None  # the queue is full: refused at once
        assert await slots.acquire(0.05) is False  # waited its time, no turn
        slots.release()
        assert all(await asyncio.gather(*waiters))

    asyncio.run(main())
    assert order == list(range(50)) and slots.free == 1


def test_a_waiter_whose_client_went_away_leaves_the_queue():
    slots = Slots(1)

    async def main():
        assert await slots.acquire(1.0)
        first = asyncio.create_task(slots.acquire(5.0))
        second = asyncio.create_task(slots.acquire(5.0))
        await asyncio.sleep(0.01)
        first.cancel()  # its request was cancelled while it waited
        with pytest.raises(asyncio.CancelledError):
            await first
        assert slots.waiting == 1
        slots.release()
        assert await second is True  # the turn went to the one still waiting

    asyncio.run(main())
    assert slots.free == 0 and slots.waiting == 0


def test_the_ledger_refuses_a_callers_answers_past_its_bound_then_the_servers():
    ledger = AnswerLedger(max_bytes=100, max_bytes_per_caller=60, retry_after_s=7)
    a = ledger.reserve("a", 50)
    with pytest.raises(BusyError, match="answer_memory_mb_per_caller") as e:
        ledger.reserve("a", 20)
    assert e.value.http_status == 429 and e.value.retry_after_s == 7
    b = ledger.reserve("b", 45)
    with pytest.raises(OverloadedError, match="answer_memory_mb") as e:
        ledger.reserve("c", 10)
    assert e.value.http_status == 503
    unchecked = ledger.reserve("c", 10, check=False)  # an answer already made is counted, never refused
    with pytest.raises(OverloadedError):
        ledger.admit("d")  # the server is full: any new request
    a.release(), a.release()  # idempotent
    b.resize(5)
    ledger.admit("d")
    unchecked.release(), b.release()
    assert ledger.snapshot() == {"bytes": 0, "answers": 0, "callers": 0}


def test_the_versioned_cache_holds_bytes_not_entries():
    sizes = {"a": 40, "b": 40, "c": 30, "huge": 200}
    cache: VersionedCache[str] = VersionedCache(100, lambda v: sizes[v])
    loads = []

    def load(v):
        return lambda: loads.append(v) or v

    for k in ("a", "b", "c"):
        cache.get(k, 0, load(k))
    assert len(cache) == 2 and cache.bytes == 70  # a (least recently used) dropped for c
    cache.get("b", 0, load("b"))
    assert loads == ["a", "b", "c"]  # b still held
    assert cache.get("huge", 0, load("huge")) == "huge"  # larger than the budget: served, not kept
    assert len(cache) == 2 and cache.bytes == 70
    cache.get("huge", 0, load("huge"))
    assert loads.count("huge") == 2


# a real server on loopback

class BigLibrary(FakeLibrary):
    """A pool of 2,000 prompts x 4,096 float16 values: a batch of all of it is a 16 MB Arrow answer,
    more than the loopback sockets' buffers take."""

    dim = 4096
    n = 2000

    def raw_gradients(self, split):
        rng = np.random.default_rng(0)
        ids = [f"p{i:04d}" for i in range(self.n)]
        columns = {"raw_norm": np.ones(self.n), "n_responses": np.full(self.n, 8), "reward_mean": np.zeros(self.n),
                   "reward_std": np.zeros(self.n), "n_tokens": np.full(self.n, 10), "status": ["ok"] * self.n}
        return FakeGradients(ids, rng.normal(size=(self.n, self.dim)).astype(np.float16), columns,
                             FakeCheckpoint("x"), split, "spec")


def _scored_checkpoint(settings, name: str = "ck") -> str:
    """A checkpoint row whose scoring job is recorded as succeeded (the fake library serves its results)."""
    registry, jobs = Registry(settings.db_path), JobStore(settings.db_path)
    pool = registry.add_dataset(f"pool-{name}", "/x/pool.jsonl", "pool", 3).id
    job = jobs.create("scoring", "builtin", {"name": name}, key=scoring_key(name, "spec"))
    claimed = jobs.claim("test", max_attempts=1)
    jobs.finish(job.id, claimed.attempts, "succeeded", result={})
    row = CheckpointRow(new_id("ck"), name, "/x/model", pool, [], "spec", job.id, time.time())
    registry.add_checkpoint(row)
    return row.id


class Served:
    """The app served by uvicorn with the service's own configuration, on a free loopback port."""

    def __init__(self, tmp_path: Path, library: FakeLibrary, protocol: str | None = None, **over):
        import uvicorn

        (tmp_path / "data").mkdir(exist_ok=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.settings = make_settings(tmp_path, token=f"{TOKEN}\n{OTHER}", workers=0, port=port, **over)
        self.app = create_app(self.settings, library=library, kinds=KINDS)
        config = server_config(self.settings, self.app)
        if protocol == "h11":  # uvicorn's pure-Python protocol, where httptools is not installed
            from uvicorn.protocols.http.h11_impl import H11Protocol

            config.http = guarded_protocol(self.settings, base=H11Protocol)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.base = f"http://127.0.0.1:{port}"
        self.port = port

    def __enter__(self) -> "Served":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)

    @property
    def service(self):
        return self.app.state.service


def _raw_post(port: int, path: str, body: dict, token: str = TOKEN, accept: str = ARROW) -> socket.socket:
    """A client that sends a request and never reads the answer (a small receive buffer: it takes little)."""
    data = json.dumps(body).encode()
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nAccept: {accept}\r\n"
              f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    return s


def _until(check, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.parametrize("protocol", ["auto", "h11"])
def test_unread_answers_count_against_their_caller_until_the_stalled_connection_is_closed(tmp_path, protocol):
    library = BigLibrary(tmp_path)
    over = dict(max_response_mb=24, answer_memory_mb_per_caller=40, answer_memory_mb=64, stall_timeout_s=6)
    with Served(tmp_path, library, protocol, **over) as served:
        ck = _scored_checkpoint(served.settings)
        ids = [f"p{i:04d}" for i in range(BigLibrary.n)]
        path = f"/v1/checkpoints/{ck}/gradients:batch"
        ledger = served.service.answers
        stalled = [_raw_post(served.port, path, {"prompt_ids": ids})]
        _until(lambda: ledger.snapshot()["answers"] == 1)
        stalled.append(_raw_post(served.port, path, {"prompt_ids": ids}))
        _until(lambda: ledger.snapshot()["answers"] == 2)
        held = ledger.snapshot()["bytes"]
        assert 2 * BigLibrary.n * BigLibrary.dim * 2 < held <= 40 * MB  # two answers, counted while unread
        with httpx.Client(base_url=served.base, timeout=10) as c:
            t = time.monotonic()
            r = c.post(path, json={"prompt_ids": ids}, headers={**AUTH, "Accept": ARROW})
            assert r.status_code == 429, r.text  # the same caller: a third would pass its bound
            assert r.json()["error"]["code"] == "busy" and "answer_memory_mb_per_caller" in r.json()["error"]["message"]
            assert int(r.headers["Retry-After"]) >= 1
            assert c.get(f"/v1/checkpoints/{ck}/gradients/p0001", headers=AUTH).status_code == 200  # fits
            r = c.post(path, json={"prompt_ids": ids[:500]}, headers={"Authorization": f"Bearer {OTHER}",
                                                                      "Accept": ARROW})
            assert r.status_code == 200 and len(r.content) > 500 * 8192  # another caller is served
            health = c.get("/healthz")
            assert health.status_code == 200
            if time.monotonic() - t < 4:  # well within stall_timeout_s (a slow machine may take longer)
                assert ledger.snapshot()["answers"] == 2  # still held
        # the stalled readers are closed after stall_timeout_s, and their answers' memory freed
        _until(lambda: ledger.snapshot() == {"bytes": 0, "answers": 0, "callers": 0}, timeout=10)
        for s in stalled:  # each connection ends (reset or closed) before its whole answer was sent
            s.settimeout(5)
            got = 0
            try:
                while chunk := s.recv(1 << 20):  # what the kernels held arrives, then the end
                    got += len(chunk)
            except ConnectionResetError:
                pass
            assert got < BigLibrary.n * BigLibrary.dim * 2
            s.close()
        with httpx.Client(base_url=served.base, timeout=10) as c:
            r = c.post(path, json={"prompt_ids": ids}, headers={**AUTH, "Accept": ARROW})
            assert r.status_code == 200 and len(r.content) > BigLibrary.n * BigLibrary.dim * 2  # read: served


@pytest.mark.parametrize("protocol", ["auto", "h11"])
def test_a_big_arrow_answer_is_made_off_the_event_loop_and_sent_from_arrows_own_buffer(tmp_path, monkeypatch,
                                                                                        protocol):
    """Issue 31: the health check answers while a big Arrow batch is being encoded (in a request thread,
    not the event loop's), and the answer goes to the network from the buffer Arrow wrote it into. Its
    copy into bytes (41 MB for 10k ids at k=2048, fresh pages) held the GIL, and with it the event loop,
    for 30 ms at a time; Arrow encodes without the GIL."""
    encoding, go_on = threading.Event(), threading.Event()
    made: dict = {}
    encode = GradientView.arrow_stream

    def arrow_stream(self, prompt_ids, peek=False):
        made.setdefault("threads", set()).add(threading.get_ident())
        encoding.set()
        assert go_on.wait(60), "the test never let the encoding go on"
        made.setdefault("answers", []).append(encode(self, prompt_ids, peek))
        return made["answers"][-1]

    monkeypatch.setattr(GradientView, "arrow_stream", arrow_stream)
    library = BigLibrary(tmp_path)
    stored = library.raw_gradients("pool")
    with Served(tmp_path, library, protocol) as served:
        ck = _scored_checkpoint(served.settings)
        ids = stored.prompt_ids[::-1]  # asked in an order of their own
        pool = ThreadPoolExecutor(1)
        try:
            batch = pool.submit(httpx.post, f"{served.base}/v1/checkpoints/{ck}/gradients:batch",
                                json={"prompt_ids": ids}, headers={**AUTH, "Accept": ARROW}, timeout=60)
            assert encoding.wait(60)
            with httpx.Client(base_url=served.base, timeout=60) as c:
                assert c.get("/healthz").status_code == 200  # answered while the batch is being encoded
                assert not batch.done()
                go_on.set()
                r = batch.result(60)
                # a single lookup of a loaded split takes the hot path: its Arrow view goes out as it is
                one = c.get(f"/v1/checkpoints/{ck}/gradients/{ids[0]}", headers={**AUTH, "Accept": ARROW})
        finally:
            go_on.set()
            pool.shutdown(wait=False, cancel_futures=True)
        assert served.thread.ident not in made["threads"]  # the event loop's thread encoded nothing
    answer = made["answers"][0]  # the batch's
    assert isinstance(answer, memoryview) and isinstance(answer.obj, pa.Buffer)  # Arrow's buffer, no copy
    assert r.status_code == 200 and r.headers["content-type"] == ARROW
    assert r.content == bytes(answer) and len(r.content) > BigLibrary.n * BigLibrary.dim * 2
    table = pa.ipc.open_stream(r.content).read_all()
    assert table.column("prompt_id").to_pylist() == ids
    vectors = np.asarray(table.column("vector").combine_chunks().flatten()).reshape(len(ids), BigLibrary.dim)
    assert np.array_equal(vectors, stored.vectors[::-1])
    assert one.status_code == 200
    single = pa.ipc.open_stream(one.content).read_all()
    assert single.column("prompt_id").to_pylist() == ids[:1]
    assert np.array_equal(np.asarray(single.column("vector")[0].values), stored.vectors[-1])


def test_cropi_serve_freezes_its_startup_heap_before_serving(tmp_path, monkeypatch):
    """Issue 31: a full pass of the cyclic collector over the server's startup objects held the GIL, and
    the event loop answering /healthz, 60-90 ms at a time while batches were made. ``cropi serve``
    freezes them out of its passes (``freeze_startup_heap``) and sets the GIL's switch interval, just
    before it serves."""
    import uvicorn

    from cropi_service.entry import cli

    seen: list = []
    monkeypatch.setattr(cli, "configure_logging", lambda: None)
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, *a, **k: seen.append(
        ("run", gc.get_freeze_count(), sys.getswitchinterval())))
    interval = sys.getswitchinterval()
    try:
        cli.serve(tmp_path / "root", workers=0)
        assert seen[0][0] == "run" and seen[0][1] > 10_000  # the modules and the app: frozen when it serves
        assert seen[0][2] == pytest.approx(ServiceSettings.model_fields["switch_interval_ms"].default / 1000)
        gc.unfreeze()
        monkeypatch.setenv("CROPI_SERVICE_FREEZE_STARTUP_HEAP", "false")
        cli.serve(tmp_path / "root", workers=0)
        assert seen[1][:2] == ("run", 0)  # the setting off: nothing frozen
    finally:
        gc.unfreeze()
        sys.setswitchinterval(interval)


def test_batches_waiting_for_a_turn_leave_health_and_ordinary_routes_answering(tmp_path):
    """Before, 60 waiting batches held 60 of the server's 40 request threads: /healthz took 5.4 s."""
    with Served(tmp_path, FakeLibrary(tmp_path), heavy_requests=1, heavy_wait_s=20, heavy_queue=200) as served:
        ck = _scored_checkpoint(served.settings)
        svc = served.service
        assert svc.heavy.try_acquire()  # one batch being made, for as long as the test likes
        pool = ThreadPoolExecutor(70)
        try:
            with httpx.Client(base_url=served.base, timeout=30, limits=httpx.Limits(max_connections=100)) as c:
                body = {"prompt_ids": ["p01", "p02"]}
                batches = [pool.submit(c.post, f"/v1/checkpoints/{ck}/gradients:batch", json=body, headers=AUTH)
                           for _ in range(60)]
                _until(lambda: svc.heavy.waiting == 60)
                took = []
                for _ in range(20):
                    t = time.perf_counter()
                    assert c.get("/healthz").status_code == 200
                    assert c.get(f"/v1/checkpoints/{ck}", headers=AUTH).status_code == 200  # a threaded route
                    took.append(time.perf_counter() - t)
                assert max(took) < 1.0, took  # milliseconds on a quiet machine; seconds meant starved
                assert not any(b.done() for b in batches)
                svc.heavy.release()
                assert [b.result().status_code for b in batches] == [200] * 60
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        assert svc.heavy.free == 1


@pytest.mark.parametrize("protocol", ["auto", "h11"])
def test_connections_past_the_bound_get_503_and_a_stalled_body_408(tmp_path, protocol):
    with Served(tmp_path, FakeLibrary(tmp_path), protocol, max_connections=3, stall_timeout_s=1.0) as served:
        held = [socket.create_connection(("127.0.0.1", served.port)) for _ in range(3)]
        time.sleep(0.2)
        with httpx.Client(base_url=served.base, timeout=10) as c:
            r = c.get("/healthz")
            assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded"
            assert "max_connections" in r.json()["error"]["message"] and "Retry-After" in r.headers
        # the idle connections are closed after stall_timeout_s (they never sent a request): room again
        time.sleep(1.5)
        for s in held:  # closed (or reset) by the server, not by us
            s.settimeout(2)
            try:
                assert s.recv(1) == b""
            except ConnectionResetError:
                pass
            s.close()
        with httpx.Client(base_url=served.base, timeout=10) as c:
            assert c.get("/healthz").status_code == 200
        s = socket.create_connection(("127.0.0.1", served.port))
        s.sendall(f"POST /v1/datasets HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                  "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"name\":".encode())
        s.settimeout(5)
        answer = s.recv(65536).decode()
        assert answer.startswith("HTTP/1.1 408") and '"request_timeout"' in answer and "stall_timeout_s" in answer
        s.close()


# registrations

def _env(tmp_path, **over):
    (tmp_path / "data" / "model").mkdir(parents=True, exist_ok=True)
    (tmp_path / "release").mkdir(exist_ok=True)
    fake = FakeLibrary(tmp_path / "release")
    return create_app(make_settings(tmp_path, **over), library=fake, kinds=KINDS), fake


def test_registrations_are_bounded_paged_and_removable_without_losing_what_is_stored(tmp_path):
    app, fake = _env(tmp_path, max_datasets=4, max_checkpoints=2)
    with TestClient(app) as client:
        env = Env(tmp_path, client, fake)
        cks = [env.checkpoint(f"ck{i}").json()["id"] for i in range(2)]  # registers pool, gsm, math
        for ck in cks:
            assert env.wait(env.get(f"/v1/checkpoints/{ck}").json()["job"]["id"])["state"] == "succeeded"
        r = env.checkpoint("ck2")
        assert r.status_code == 409 and r.json()["error"]["code"] == "registry_full"
        message = r.json()["error"]["message"]
        assert "max_checkpoints=2" in message and "DELETE /v1/checkpoints/{id}" in message
        env.dataset("extra", "validation")
        path = tmp_path / "data" / "more.jsonl"
        path.write_text('{"prompt_id": "a", "prompt": "q", "answer": "1"}\n')
        r = env.post("/v1/datasets", json={"name": "more", "path": str(path), "kind": "pool"})
        assert r.status_code == 409 and "max_datasets=4" in r.json()["error"]["message"]

        page = env.get("/v1/datasets", params={"offset": 1, "limit": 2}).json()
        assert page["total"] == 4 and page["offset"] == 1 and page["limit"] == 2
        assert [d["name"] for d in page["items"]] == ["gsm", "math"]
        assert env.get("/v1/datasets", params={"limit": 1001}).status_code == 422
        listed = env.get("/v1/checkpoints").json()
        assert listed["total"] == 2 and [c["id"] for c in listed["items"]] == cks

        r = env.delete(f"/v1/datasets/{env.ids['pool']}")
        assert r.status_code == 409 and cks[0] in r.json()["error"]["message"]  # read by a checkpoint
        assert env.delete(f"/v1/datasets/{env.ids['extra']}").status_code == 200
        assert env.get("/v1/datasets").json()["total"] == 3

        ranking = env.get(f"/v1/checkpoints/{cks[0]}/ranking").json()
        assert env.delete(f"/v1/checkpoints/{cks[0]}").status_code == 200
        assert env.get(f"/v1/checkpoints/{cks[0]}").status_code == 404
        assert env.get(f"/v1/checkpoints/{cks[0]}/ranking").status_code == 404
        assert env.get("/v1/checkpoints").json()["total"] == 1
        again = env.checkpoint("ck0")  # room again; the same inputs score the same name again
        assert again.status_code == 202, again.text
        assert env.wait(again.json()["job_id"])["state"] == "succeeded"
        assert env.get(f"/v1/checkpoints/{again.json()['id']}/ranking").json()["items"] == ranking["items"]
        # the removed checkpoint still guards what it scored: other inputs under its name are refused
        assert env.delete(f"/v1/checkpoints/{again.json()['id']}").status_code == 200
        r = env.post("/v1/checkpoints", json={"name": "ck0", "path": str(tmp_path / "data" / "model"),
                                              "pool": env.ids["pool"], "validation": [env.ids["gsm"]]})
        assert r.status_code == 409 and r.json()["error"]["code"] == "ranking_conflict"


def test_a_checkpoint_being_scored_is_not_removed(tmp_path):
    app, fake = _env(tmp_path)
    with TestClient(app) as client:
        env = Env(tmp_path, client, fake)
        r = env.checkpoint("slow", release=False)  # its job waits for a release file
        ck, job = r.json()["id"], r.json()["job_id"]
        env.wait(job, states=("running",))
        r = env.delete(f"/v1/checkpoints/{ck}")
        assert r.status_code == 409 and f"DELETE /v1/jobs/{job}" in r.json()["error"]["message"]
        env.release("slow")
        assert env.wait(job)["state"] == "succeeded"
        assert env.delete(f"/v1/checkpoints/{ck}").status_code == 200
