"""What the HTTP side reads from cropi: prompt counts, projection spec ids, stored rankings and
gradients, curriculum stages. Only torch-free parts of the library are imported here (the server
starts in about a second); the jobs run in worker processes (``jobs.kinds``).

Results come back as the library's own types: ``cropi.pipeline.rank.RankingResult`` and
``cropi.store.GradientTable``.
"""

from __future__ import annotations

import os
from typing import Any, Hashable, Protocol

from cropi.data import load_prompts
from cropi.errors import InvalidInputError, NotFoundError
from cropi.pipeline.rank import RankingResult, load_ranking, stored_ranking_name
from cropi.store.rankings import ranking_file
from cropi.pipeline.requests import store_path
from cropi.store import GradientStore, GradientTable, PartCache, SplitReader

from ..options.caller import Projection
from ..options.params import spec_id


class StageData(Protocol):
    index: int
    subset: str | None
    n_prompts: int | None
    checkpoint: str | None


class Library(Protocol):
    """What the HTTP app needs from cropi (tests substitute a fake)."""

    def count_prompts(self, path: str) -> int: ...

    def projection_spec_id(self, projection: Projection | None) -> str: ...

    def ranking_version(self, name: str, spec_id: str) -> Hashable | None: ...

    def ranking(self, name: str, spec_id: str) -> RankingResult: ...

    def gradients_version(self, name: str, spec_id: str, split: str) -> Hashable | None: ...

    def gradients(self, name: str, spec_id: str, split: str) -> GradientTable | SplitReader: ...

    def curriculum_stages(self, name: str, result: dict[str, Any] | None) -> list[dict[str, Any]]: ...


def file_stamp(path: str | os.PathLike) -> tuple | None:
    """(size, mtime_ns, inode) of a file: changes when it is rewritten or edited in place."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def tree_stamp(folder: str | os.PathLike) -> tuple:
    """The stamps of every file under ``folder``: a shard edited in place changes it."""
    out = []
    for dirpath, _, files in os.walk(folder):
        for f in files:
            out.append((f, file_stamp(os.path.join(dirpath, f))))
    return tuple(sorted(out, key=lambda x: x[0]))


class CropiLibrary:
    """``Library`` over the real cropi, reading the store under ``root``."""

    def __init__(self, root: str | os.PathLike, part_cache_bytes: int = 0):
        self.root = str(root)
        self.store = store_path(root)
        # verified record batches of every split, one budget for all (the server's gradient memory)
        self.parts = PartCache(part_cache_bytes)

    def count_prompts(self, path: str) -> int:
        return len(load_prompts(path))

    def projection_spec_id(self, projection: Projection | None) -> str:
        return spec_id(projection)

    def ranking_version(self, name: str, spec_id: str) -> Hashable | None:
        _, path = ranking_file(self.store, name, spec_id, stored_ranking_name(self.store, name, spec_id))
        return file_stamp(path)

    def ranking(self, name: str, spec_id: str) -> RankingResult:
        # the one ranking of the pool: a checkpoint scored with a non-default selector stores it by that name
        return load_ranking(self.store, name, pool=stored_ranking_name(self.store, name, spec_id), spec_id=spec_id)

    def gradients_version(self, name: str, spec_id: str, split: str) -> Hashable | None:
        split_ = GradientStore(self.store).open_split(name, spec_id, split)
        # the commit stamp names new shards; the file stamps catch a shard changed in place
        return split_.version(), tree_stamp(split_.dataset.path)

    def gradients(self, name: str, spec_id: str, split: str) -> SplitReader:
        """The split open for lookups: its key index now, its vectors a record batch at a time."""
        return SplitReader(GradientStore(self.store).open_split(name, spec_id, split), self.parts)

    def curriculum_stages(self, name: str, result: dict[str, Any] | None) -> list[dict[str, Any]]:
        """Stages from the finished job's result, or, while it runs, from the curriculum's stored state."""
        if result is None:
            # imported here, not at the top: cropi.pipeline.curriculum imports torch, which only a
            # running curriculum's view needs (never the server's start)
            from cropi.pipeline.curriculum import load_state, summary

            try:
                result = summary(load_state(self.root, name))
            except NotFoundError:
                return []  # nothing stored yet: the job has not reached its first step
        stages = result.get("stages") or []
        if not isinstance(stages, list):
            raise InvalidInputError(f"curriculum {name!r}: its job result has no stage list")
        return [s if isinstance(s, dict) else {} for s in stages]
