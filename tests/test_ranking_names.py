"""Every ranking is stored under its selector's name (``<pool>.<selector>.parquet``), whichever selector is
the default; a store written before that (the then default's ranking as ``<pool>.parquet``) still serves
its rankings; a ranking asked for under a selector that never ran is refused naming those that did."""

from __future__ import annotations

import shutil

import pytest

from cropi.errors import NotFoundError
from cropi.pipeline.rank import UNNAMED_SELECTOR, load_ranking, rank, ranking_name, stored_ranking_name
from cropi.selection import FALLBACK_SELECTOR as OTHER  # a selector that is not cropi
from cropi.store import rankings
from support.store import CKPT, SPEC, open_split, write_grads

SPEC_ID = SPEC["spec_id"]


@pytest.fixture
def root(tmp_path):
    """A store with a pool and a validation split at one checkpoint (rows a function of the prompt id)."""
    store = tmp_path / "store"
    write_grads(open_split(store, split="pool"), "w0", [f"p{i:02d}" for i in range(40)])
    write_grads(open_split(store, split="val"), "w0", [f"v{i:02d}" for i in range(12)], salt="v")
    return tmp_path


def _rank(store, selector: str):
    return rank(str(store), CKPT.name, "pool", ["val"], top_fraction=0.25, selector=selector)


def _folder(root):
    return root / "store" / "rankings" / CKPT.name / SPEC_ID


def test_every_ranking_is_named_by_its_selector(root):
    store = root / "store"
    for selector in (OTHER, "cropi"):
        _rank(store, selector)
    names = sorted(p.name for p in _folder(root).glob("*.parquet"))
    assert names == sorted(f"pool.{s}.parquet" for s in (OTHER, "cropi"))
    assert ranking_name("pool", OTHER) == f"pool.{OTHER}"  # every selector: no bare 'pool'
    for selector in (OTHER, "cropi"):
        got = load_ranking(str(store), CKPT.name, selector=selector)
        assert got.meta["selector"] == selector


def _as_before_the_renaming(root, selector: str) -> None:
    """Move ``selector``'s ranking to the name it had when it was the default (its checksum file too)."""
    folder = _folder(root)
    for suffix in ("", rankings.CHECKSUM_SUFFIX):
        shutil.move(folder / f"pool.{selector}.parquet{suffix}", folder / f"pool.parquet{suffix}")


def test_a_store_written_before_the_renaming_still_serves_its_rankings(root):
    from cropi_service.domain.library import CropiLibrary

    store = str(root / "store")
    want = _rank(root / "store", OTHER).table
    _as_before_the_renaming(root, OTHER)
    assert load_ranking(store, CKPT.name, selector=OTHER).table.equals(want)
    assert stored_ranking_name(store, CKPT.name, SPEC_ID) == "pool"
    served = CropiLibrary(root).ranking(CKPT.name, SPEC_ID)  # the service's one ranking of the checkpoint
    assert served.table.equals(want) and CropiLibrary(root).ranking_version(CKPT.name, SPEC_ID) is not None
    # a selector that ran since is stored under its own name, beside the old file
    _rank(root / "store", "cropi")
    assert load_ranking(store, CKPT.name, selector="cropi").meta["selector"] == "cropi"
    assert load_ranking(store, CKPT.name, selector=OTHER).table.equals(want)


def test_a_ranking_older_than_the_selectors_counts_as_cropis(root):
    """Before the selector registry a ranking's meta named no selector: CROPI's top fraction was the rule."""
    store = str(root / "store")
    result = _rank(root / "store", "cropi")
    meta = {k: v for k, v in result.meta.items() if k not in ("selector", "selector_options")}
    rankings.save(store, CKPT.name, SPEC_ID, "pool", result.table, meta)
    (_folder(root) / "pool.cropi.parquet").unlink()
    assert UNNAMED_SELECTOR == "cropi"
    assert load_ranking(store, CKPT.name, selector="cropi").table.equals(result.table)


def test_a_selector_that_never_ran_is_refused_naming_the_rankings_that_exist(root):
    store = str(root / "store")
    _rank(root / "store", "cropi")
    _as_before_the_renaming(root, "cropi")
    _rank(root / "store", OTHER)
    with pytest.raises(NotFoundError) as info:
        load_ranking(store, CKPT.name, selector="random")
    text = str(info.value)
    assert "'random'" in text and f"{OTHER} (pool.{OTHER}.parquet)" in text
    assert "cropi (pool.parquet)" in text
    with pytest.raises(NotFoundError, match="rankings stored there: none"):
        stored_ranking_name(store, "nobody", SPEC_ID, selector="cropi")
