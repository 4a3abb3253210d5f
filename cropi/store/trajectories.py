"""The trajectory store: K sampled responses per prompt, with behavior log-probs and rewards.

One sharded Parquet dataset, one row per response. All rows of a prompt are
committed in the same shard, so a prompt is either complete or absent.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Iterable, Iterator

import pyarrow as pa

from cropi.errors import CorruptDataError, InvalidInputError, MismatchError, NotFoundError
from cropi.store.schema import check_table
from cropi.store.sharded import BufferedWriter, ShardedDataset


def _list(t: pa.DataType) -> pa.DataType:
    return pa.list_(pa.field("item", t, nullable=False))


TRAJECTORY_SCHEMA = pa.schema([
    pa.field("prompt_id", pa.string(), nullable=False),
    pa.field("sample_index", pa.int32(), nullable=False),
    pa.field("prompt_token_ids", _list(pa.int32()), nullable=False),
    pa.field("response_token_ids", _list(pa.int32()), nullable=False),
    pa.field("behavior_logprobs", _list(pa.float32()), nullable=False),
    pa.field("response_text", pa.string(), nullable=False),
    pa.field("reward", pa.float32(), nullable=True),  # null: the reward function raised
    pa.field("finish_reason", pa.string(), nullable=False),
])


@dataclass
class PromptTrajectories:
    """One prompt's responses, ordered by sample index."""

    prompt_id: str
    prompt_token_ids: list[int]
    responses: list[list[int]]
    behavior_logprobs: list[list[float]]
    rewards: list[float | None]
    finish_reasons: list[str]
    texts: list[str]


class TrajectoryStore:
    """Trajectories of one behavior checkpoint under one sampling setup (see the identity)."""

    def __init__(self, dataset: ShardedDataset):
        if dataset.identity.get("kind") != "trajectories":
            raise MismatchError(f"{dataset.path} holds {dataset.identity.get('kind')!r} data, not trajectories")
        self.dataset = dataset

    @classmethod
    def create_or_open(cls, root: str, identity: dict) -> "TrajectoryStore":
        """Create the store, or reopen it if its stored identity equals ``identity``."""
        if not isinstance(identity, dict) or identity.get("kind", "trajectories") != "trajectories":
            raise InvalidInputError(f"a trajectory identity must be a dict of kind 'trajectories', got {identity!r}")
        identity = {"kind": "trajectories", **identity}
        return cls(ShardedDataset(root, identity, "parquet", TRAJECTORY_SCHEMA, "prompt_id"))

    @classmethod
    def open(cls, root: str) -> "TrajectoryStore":
        """An existing store; NotFoundError if ``root`` has no manifest."""
        return cls(ShardedDataset(root))

    @property
    def identity(self) -> dict:
        return self.dataset.identity

    @property
    def fingerprint(self) -> str:
        """Short hash of the identity and every commit: names this exact trajectory set."""
        doc = {"identity": self.identity, "commits": self.dataset.commits()}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]

    def writer(self, writer_id: str, prompts_per_shard: int = 32) -> "TrajectoryWriter":
        return TrajectoryWriter(self, writer_id, prompts_per_shard)

    def committed_prompt_ids(self) -> set[str]:
        return self.dataset.committed_keys()

    def read_table(self, verify: bool = True) -> pa.Table:
        """Every committed row (first writer's copy of a prompt wins), checksums verified."""
        return self.dataset.read()

    def iter_prompts(self, prompt_ids: Iterable[str] | None = None, verify: bool = True
                     ) -> Iterator[PromptTrajectories]:
        """Each prompt's trajectories (all, or those named), in storage order, one shard in memory at a time."""
        wanted = None if prompt_ids is None else set(prompt_ids)
        if wanted:
            missing = wanted - self.committed_prompt_ids()
            if missing:
                raise NotFoundError(f"{len(missing)} prompts have no trajectories in {self.dataset.path}: "
                                    f"{sorted(missing)[:5]}; collect them first")
        found: set[str] = set()
        for table in self.dataset.iter_shards(keys=wanted):
            for traj in _group(table, self.dataset.path):
                found.add(traj.prompt_id)
                yield traj
        if wanted and wanted - found:
            # committed, yet in no shard whose recorded key range holds it: a commit file was edited
            lost = sorted(wanted - found)
            raise CorruptDataError(f"{len(lost)} committed prompts of {self.dataset.path} lie in no shard whose "
                                   f"recorded key range holds them (e.g. {lost[:3]}): a commit file under "
                                   f"{self.dataset.path}/commits was changed; restore it, or delete it with its "
                                   "writer's shards and collect those prompts again")


def _group(table: pa.Table, where: str) -> Iterator[PromptTrajectories]:
    groups: dict[str, list[dict]] = {}
    for row in table.to_pylist():
        groups.setdefault(row["prompt_id"], []).append(row)
    for pid, rows in groups.items():
        rows.sort(key=lambda r: r["sample_index"])
        problem = _row_problem(rows)
        if problem:
            raise CorruptDataError(f"prompt {pid!r} in {where}: {problem}; remove its shard's entry from the "
                                   "commit file and collect it again")
        yield PromptTrajectories(pid, rows[0]["prompt_token_ids"], [r["response_token_ids"] for r in rows],
                                 [r["behavior_logprobs"] for r in rows], [r["reward"] for r in rows],
                                 [r["finish_reason"] for r in rows], [r["response_text"] for r in rows])


def _row_problem(rows: list[dict]) -> str | None:
    """What is wrong with one prompt's rows, or None."""
    if len({r["prompt_id"] for r in rows}) != 1:
        return "rows name different prompt_ids"
    if len({r["sample_index"] for r in rows}) != len(rows):
        return "sample_index repeats"
    if any(r["prompt_token_ids"] != rows[0]["prompt_token_ids"] for r in rows):
        return "responses disagree on prompt_token_ids"
    for r in rows:
        if len(r["behavior_logprobs"]) != len(r["response_token_ids"]):
            return (f"sample {r['sample_index']} has {len(r['response_token_ids'])} response tokens but "
                    f"{len(r['behavior_logprobs'])} behavior log-probs (need one per token)")
        reward = r["reward"]
        if reward is not None and not math.isfinite(reward):
            return f"sample {r['sample_index']} has reward {reward!r} (need a finite number, or None if it failed)"
    return None


class TrajectoryWriter(BufferedWriter):
    """Commits whole prompts, ``prompts_per_shard`` per shard (the rest on flush/close)."""

    what = "trajectories"

    def __init__(self, store: TrajectoryStore, writer_id: str, prompts_per_shard: int = 32):
        if isinstance(prompts_per_shard, bool) or not isinstance(prompts_per_shard, int) or prompts_per_shard < 1:
            raise InvalidInputError(f"prompts_per_shard must be a positive integer, got {prompts_per_shard!r}")
        self.prompts_per_shard = prompts_per_shard
        super().__init__(store.dataset.writer(writer_id))
        self._pending: dict[str, pa.Table] = {}

    def commit_prompt_rows(self, rows: list[dict]) -> None:
        """Buffer all K rows of one prompt; any bad row rejects the whole prompt, nothing buffered."""
        if self._closed:
            raise InvalidInputError("this trajectory writer is closed; open a new one with store.writer(...)")
        if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
            raise InvalidInputError("commit_prompt_rows needs a non-empty list of row dicts (one per response)")
        pid = rows[0].get("prompt_id")
        names = set(TRAJECTORY_SCHEMA.names)
        for r in rows:
            if set(r) != names:
                raise InvalidInputError(f"prompt {pid!r}: row missing {sorted(names - set(r))}, "
                                        f"unexpected {sorted(set(r) - names)}")
        if not isinstance(pid, str) or not pid:
            raise InvalidInputError(f"prompt_id must be a non-empty string, got {pid!r}")
        if pid in self._pending or pid in self._shard.committed_keys():
            raise InvalidInputError(f"prompt {pid!r} is already committed by writer {self._shard.writer_id}")
        try:
            table = check_table(pa.Table.from_pylist(rows, schema=TRAJECTORY_SCHEMA), TRAJECTORY_SCHEMA)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as e:
            raise InvalidInputError(f"prompt {pid!r}: rows do not fit the trajectory schema ({e})") from e
        problem = _row_problem(table.to_pylist())  # checked on the typed rows, whatever the caller passed
        if problem:
            raise InvalidInputError(f"prompt {pid!r}: {problem}")
        self._pending[pid] = table
        if len(self._pending) >= self.prompts_per_shard:
            self.flush()

    def flush(self) -> None:
        """Commit the buffered prompts as one shard."""
        if self._pending:
            self._shard.commit(pa.concat_tables(list(self._pending.values())))
            self._pending = {}

    def buffered(self) -> int:
        return len(self._pending)
