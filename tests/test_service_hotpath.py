"""The in-memory fast path of the two hot reads (``HotPaths``, the reads with ``peek=True``) and the render cache.

A ranking page or single gradient lookup taken by the fast path must be byte-identical to the
full FastAPI route's answer, and a stored result that changed on disk must be served once its
version stamp is looked at again (``version_ttl_s``), as on the full route.
"""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pyarrow as pa
import pytest
from fastapi.testclient import TestClient


from cropi.contracts import GRADIENT_META_COLUMNS, GRADIENT_OPTIONAL_COLUMNS
from cropi_service.api.app import create_app
from cropi_service.domain.cache import ByteLRU, NotLoaded
from cropi_service.domain import views
from cropi_service.domain.views import GradientView, RankingView, _finite, vector_json, vector_json_bytes
from support.service import ARROW, FakeLibrary, KINDS, make_settings, Env, env, assert_error, read_arrow

TTL = 0.3


class ChangingLibrary(FakeLibrary):
    """The fake library whose stored ranking and vectors change with ``version`` (a rewritten store).

    Versions start at 1: a falsy ranking stamp means "no stored file" to the service (versioned by the
    job table instead, which the fast path leaves to the full route)."""

    def __init__(self, release_dir):
        super().__init__(release_dir)
        self.version = 1

    def ranking(self, name, spec_id):
        data = super().ranking(name, spec_id)
        fused = data.table["fused"].to_numpy(zero_copy_only=False) + 10.0 * self.version
        data.table = data.table.set_column(data.table.column_names.index("fused"), "fused", pa.array(fused))
        return data

    def gradients(self, name, spec_id, split):
        data = super().gradients(name, spec_id, split)
        data.vectors = (data.vectors.astype(np.float32) + self.version).astype(np.float16)
        return data


@pytest.fixture
def hot(tmp_path):
    (tmp_path / "data" / "model").mkdir(parents=True)
    (tmp_path / "release").mkdir()
    fake = ChangingLibrary(tmp_path / "release")
    app = create_app(make_settings(tmp_path, version_ttl_s=TTL), library=fake, kinds=KINDS)
    with TestClient(app) as client:
        env = Env(tmp_path, client, fake)
        r = env.checkpoint("ck")
        assert env.wait(r.json()["job_id"])["state"] == "succeeded"
        env.ck = r.json()["id"]
        env.svc = app.state.service
        yield env


def count_full_route(env, monkeypatch) -> dict[str, int]:
    """Counts the full route's reads (the fast path makes the same calls with peek=True, not counted)."""
    calls = {"ranking": 0, "gradient": 0}
    svc = env.svc
    ranking_page, gradient_view = svc.ranking_page, svc.gradient_view

    def counted_page(checkpoint_id, offset, limit, validation, peek=False):
        calls["ranking"] += not peek
        return ranking_page(checkpoint_id, offset, limit, validation, peek)

    def counted_view(checkpoint_id, split, peek=False):
        calls["gradient"] += not peek
        return gradient_view(checkpoint_id, split, peek)

    monkeypatch.setattr(svc, "ranking_page", counted_page)
    monkeypatch.setattr(svc, "gradient_view", counted_view)
    return calls


def test_fast_answers_equal_the_full_route_byte_for_byte(hot, monkeypatch):
    ck = hot.ck
    hot.svc.settings.version_ttl_s = 600  # no stamp due for a look during the test: every fast request is fast
    urls = [f"/v1/checkpoints/{ck}/ranking?offset=3&limit=17", f"/v1/checkpoints/{ck}/ranking",
            f"/v1/checkpoints/{ck}/ranking?validation=math&limit=1000", f"/v1/checkpoints/{ck}/gradients/p05",
            f"/v1/checkpoints/{ck}/gradients/dir/with slash", f"/v1/checkpoints/{ck}/gradients/g03?split=gsm",
            f"/v1/checkpoints/{ck}/ranking?offset=100000&limit=5"]
    for url in urls:  # warm: the full route loads the views and encodes the orders
        assert hot.get(url).status_code == 200
    calls = count_full_route(hot, monkeypatch)
    for url in urls:
        fast = hot.get(url)
        assert calls == {"ranking": 0, "gradient": 0}, f"{url} did not take the fast path"
        hot.svc.settings.version_ttl_s = 0  # every stamp due for a look: the full route answers
        full = hot.get(url)
        hot.svc.settings.version_ttl_s = 600
        assert sum(calls.values()) == 1, f"{url} did not take the full route"
        calls.update(ranking=0, gradient=0)
        assert fast.status_code == full.status_code == 200
        assert fast.content == full.content, url
        assert fast.headers["content-type"] == full.headers["content-type"] == "application/json"
        assert fast.headers["content-length"] == full.headers["content-length"]
        json.loads(fast.content)
    # metrics and logs name the route for fast answers too
    text = hot.get("/metrics").text
    line = next(ln for ln in text.splitlines() if ln.startswith("cropi_http_request_duration_seconds_count")
                and 'route="/v1/checkpoints/{checkpoint_id}/ranking"' in ln)
    assert line.endswith(" 12.0")  # 4 pages, each warmed, fast and full


def test_a_changed_store_is_served_once_its_stamp_is_looked_at_again(hot):
    ck = hot.ck
    page_url, grad_url = f"/v1/checkpoints/{ck}/ranking?limit=5", f"/v1/checkpoints/{ck}/gradients/p05"
    before_page, before_grad = hot.get(page_url).json(), hot.get(grad_url).json()
    for _ in range(3):  # served from memory
        assert hot.get(page_url).json() == before_page and hot.get(grad_url).json() == before_grad
    assert hot.fake.ranking_loads == 1 and hot.fake.gradient_loads == 1
    hot.fake.version += 1  # the stored ranking and vectors were rewritten
    time.sleep(TTL * 1.5)
    page, grad = hot.get(page_url).json(), hot.get(grad_url).json()
    assert hot.fake.ranking_loads == 2 and hot.fake.gradient_loads == 2
    assert [it["fused"] for it in page["items"]] == pytest.approx([it["fused"] + 10 for it in before_page["items"]])
    old, new = np.array(before_grad["items"][0]["vector"]), np.array(grad["items"][0]["vector"])
    assert np.array_equal(new, (old.astype(np.float32) + 1).astype(np.float16).astype(np.float64))
    # and then again from memory, the new data
    assert hot.get(page_url).json() == page and hot.get(grad_url).json() == grad
    assert hot.fake.ranking_loads == 2 and hot.fake.gradient_loads == 2


def test_every_other_request_gets_the_full_routes_answer(hot):
    ck = hot.ck
    hot.svc.settings.version_ttl_s = 600
    for url in (f"/v1/checkpoints/{ck}/ranking?limit=5", f"/v1/checkpoints/{ck}/gradients/p05"):
        hot.get(url)
    base = f"/v1/checkpoints/{ck}/ranking"
    for q in ("limit=0", "limit=10001", "limit=abc", "offset=-1", "limit=", "offset=99999999999"):
        assert_error(hot.get(f"{base}?{q}"), 422, "validation_error")
    assert_error(hot.get(f"{base}?validation=nope"), 400, "invalid_input")
    assert_error(hot.get(f"{base}?validation={'v' * 129}"), 422, "validation_error")
    assert hot.get(f"{base}?limit=3&limit=4").json()["limit"] == 4  # the last value, as the route reads it
    assert hot.get(f"{base}?validation=gsm&limit=3").json()["order"] == "gsm"  # encoded by the full route first
    assert_error(hot.get(f"/v1/checkpoints/{'c' * 65}/ranking"), 422, "validation_error")
    assert_error(hot.get("/v1/checkpoints/ck_nope/ranking"), 404, "not_found")
    assert_error(hot.get("/v1/checkpoints/ck_nope/gradients/p05"), 404, "not_found")
    assert_error(hot.get(f"/v1/checkpoints/{ck}/gradients/nope"), 404, "not_found")
    assert_error(hot.get(f"/v1/checkpoints/{ck}/gradients/p05?split=other"), 404, "not_found")
    arrow = hot.get(f"/v1/checkpoints/{ck}/gradients/p05", headers={"Accept": ARROW})
    assert arrow.headers["content-type"] == ARROW and read_arrow(arrow.content)["prompt_id"].to_pylist() == ["p05"]
    assert hot.client.get(base).status_code == 401  # no token: refused before the fast path


def test_the_fast_path_can_be_switched_off(tmp_path):
    (tmp_path / "data" / "model").mkdir(parents=True)
    (tmp_path / "release").mkdir()
    fake = ChangingLibrary(tmp_path / "release")
    app = create_app(make_settings(tmp_path, version_ttl_s=60, fast_path=False), library=fake, kinds=KINDS)
    with TestClient(app) as client:
        env = Env(tmp_path, client, fake)
        r = env.checkpoint("ck")
        env.wait(r.json()["job_id"])
        url = f"/v1/checkpoints/{r.json()['id']}/ranking"
        env.get(url)
        assert app.state.service.ranking_page(r.json()["id"], 0, 100, None, peek=True) == env.get(url).content
        calls = []
        page = app.state.service.ranking_page
        app.state.service.ranking_page = lambda *a: calls.append(a) or page(*a)
        env.get(url)
        assert len(calls) == 1


def reference_records_json(data, rows: list[int]) -> bytes:
    """``GradientView.records_json`` as it was before the render cache and the bytes renderer."""
    out = []
    for r in rows:
        meta = {"prompt_id": data.prompt_ids[r]}
        for c in GRADIENT_META_COLUMNS:
            v = np.asarray(data.columns[c])[r].item()
            meta[c] = _finite(v) if isinstance(v, float) else v
        for c in GRADIENT_OPTIONAL_COLUMNS:
            meta[c] = _finite(float(data.columns[c][r])) if c in data.columns else None
        head = json.dumps(meta, allow_nan=False, separators=(",", ":"))
        out.append(f'{head[:-1]},"vector":[{vector_json(data.vectors[r])}]}}')
    return ("[" + ",".join(out) + "]").encode()


@pytest.mark.parametrize("budget", [0, 1, 10**9])
def test_rendered_records_equal_the_reference_whatever_the_cache(tmp_path, budget):
    data = FakeLibrary(tmp_path).raw_gradients("pool")
    data.columns["ess"] = np.linspace(0.5, 8, len(data.prompt_ids))
    data.columns["ess"][2] = np.nan
    view = GradientView(data, render_cache_bytes=budget)
    rows = [5, 0, 3, 5, len(data.prompt_ids) - 1]
    ids = [data.prompt_ids[r] for r in rows]
    for _ in range(2):  # the second time from the cache, when it holds them
        assert view.records_json(ids) == reference_records_json(data, rows)
    assert view.rendered.bytes <= budget
    assert len(view.rendered) == (4 if budget == 10**9 else 0)


def test_float16_bytes_equal_the_text_for_every_bit_pattern():
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    assert vector_json_bytes(every) == vector_json(every).encode()
    rng = np.random.default_rng(0)
    for v in (every[::-1], rng.standard_normal(8192).astype(np.float16), every[5:6], every[:0], every[3::7]):
        assert vector_json_bytes(v) == vector_json(v).encode()
    v32 = np.array([1.5, math.nan, -0.1], np.float32)
    assert vector_json_bytes(v32) == vector_json(v32).encode()


def test_the_byte_lru_stays_within_its_budget():
    lru = ByteLRU(100)
    for i in range(50):
        assert lru.put(i, bytes(30)) == bytes(30)
        assert lru.bytes <= 100
    assert len(lru) == 3 and lru.get(49) is not None and lru.get(0) is None
    lru.get(47)  # used: kept over 48
    lru.put("x", bytes(30))
    assert lru.get(47) is not None and lru.get(48) is None
    assert lru.put("big", bytes(101)) == bytes(101) and lru.get("big") is None
    assert ByteLRU(0).put(1, b"a") == b"a" and len(ByteLRU(0)) == 0


def test_a_fast_page_never_waits_on_an_encoding_under_way(tmp_path):
    view = RankingView(FakeLibrary(tmp_path).ranking("ck", "spec"))
    page = view.page_json("fused", 3, 7)
    with view._lock:  # another order being encoded by a worker thread
        assert view.page_json("fused", 3, 7, peek=True) == page
        with pytest.raises(NotLoaded):
            view.page_json("gsm", 3, 7, peek=True)


def test_ranking_pages_across_block_edges_are_the_rows_in_order_within_the_byte_budget(tmp_path, monkeypatch):
    """Pages are cut from 16-row blocks (the real size is 1,024) in an LRU holding a few: every page
    equals the rows ordered by hand from the raw ranking, whichever blocks it spans or re-encodes."""
    monkeypatch.setattr(views, "PAGE_BLOCK_ROWS", 16)
    monkeypatch.setattr(views, "ENCODE_ROWS", 5)  # a block encoded in slices that do not divide it
    lib = FakeLibrary(tmp_path)
    raw = lib.raw_ranking("ck")
    blocks = ByteLRU(6000)
    view = RankingView(lib.ranking("ck", "spec"), blocks)
    ranked = [i for i in range(lib.pool_size) if raw["rank"][i] > 0]
    finite = lambda x: x if math.isfinite(x) else None  # noqa: E731
    want = {"fused": sorted(ranked, key=lambda i: raw["rank"][i])}
    for v in ("gsm", "math"):
        want[v] = sorted(ranked, key=lambda i: (-(finite(raw["scores"][v][i]) or -math.inf), raw["rank"][i]))
    n = len(ranked)
    for order, rows in want.items():
        for offset, limit in [(0, 1), (0, 16), (15, 2), (16, 16), (5, 40), (n - 3, 10), (n, 5), (0, 1000), (31, 1)]:
            got = json.loads(view.page_json(order, offset, limit))
            exp = rows[offset:offset + limit]
            assert [r["prompt_id"] for r in got] == [raw["ids"][i] for i in exp]
            assert [r["position"] for r in got] == list(range(offset + 1, offset + 1 + len(exp)))
            assert [r["rank"] for r in got] == [int(raw["rank"][i]) for i in exp]
            for r, i in zip(got, exp):
                assert r["fused"] == pytest.approx(raw["fused"][i])
                assert r["scores"] == {v: pytest.approx(finite(raw["scores"][v][i])) if finite(raw["scores"][v][i])
                                       is not None else None for v in ("gsm", "math")}
            assert blocks.bytes <= 6000
    with pytest.raises(Exception, match="unknown validation set"):
        view.page_json("nope", 0, 5)


def test_a_fast_page_needs_every_block_it_spans_encoded(tmp_path, monkeypatch):
    monkeypatch.setattr(views, "PAGE_BLOCK_ROWS", 16)
    view = RankingView(FakeLibrary(tmp_path).ranking("ck", "spec"), ByteLRU(1 << 20))
    with pytest.raises(NotLoaded):
        view.page_json("fused", 0, 10, peek=True)
    page = view.page_json("fused", 0, 16)
    assert view.page_json("fused", 0, 16, peek=True) == page
    with pytest.raises(NotLoaded):  # rows 10..25 span block 1, never encoded
        view.page_json("fused", 10, 16, peek=True)


def test_a_cold_block_is_encoded_once_however_many_requests_want_it(tmp_path, monkeypatch):
    import threading

    monkeypatch.setattr(views, "PAGE_BLOCK_ROWS", 16)
    view = RankingView(FakeLibrary(tmp_path).ranking("ck", "spec"), ByteLRU(1 << 20))
    encodes, real = [], view._encode_block

    def slow(*args):
        encodes.append(args)
        time.sleep(0.05)  # long enough for every thread to arrive while the first encodes
        return real(*args)

    monkeypatch.setattr(view, "_encode_block", slow)
    pages = []
    threads = [threading.Thread(target=lambda: pages.append(view.page_json("fused", 3, 5))) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(encodes) == 1 and len(set(pages)) == 1 and len(pages) == 12
