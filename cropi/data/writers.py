"""Write prompt records as JSONL, plain Parquet, or verl RLVR Parquet, atomically.

The verl layout is the one verl's own ``examples/data_preprocess/gsm8k.py`` writes
and ``verl.utils.dataset.rl_dataset.RLHFDataset`` reads, one row per prompt::

    data_source   string                    picks verl's default reward function
    prompt        list<struct<role, content>>  chat messages (text becomes one user turn)
    ability       string                    "math"
    reward_model  struct<style, ground_truth>  {"style": "rule", "ground_truth": answer}
    extra_info    struct                    {split, index, prompt_id, ...record.extra_info}

``extra_info.index`` is the row's position, which RLHFDataset copies to the
batch's ``index``; ``split``, ``index`` and ``prompt_id`` are set here (a
record's own values for them are replaced) and stripped again by
``load_prompts``, so ``load_prompts(write_verl_parquet(records))`` gives the
records back (text prompts come back as one user message).
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from cropi.data.records import PromptRecord, as_messages
from cropi.errors import InvalidInputError
from cropi.utils.fsio import atomic_write_bytes, resolve


def write_jsonl(records: list[PromptRecord], path: str) -> None:
    """One JSON object a line: prompt_id, prompt, answer, data_source, extra_info."""
    _check(records)
    lines = [json.dumps(r.model_dump(), ensure_ascii=False, allow_nan=False) for r in records]
    _write(path, ("\n".join(lines) + "\n").encode("utf-8"))


def write_parquet(records: list[PromptRecord], path: str) -> None:
    """The plain contract as Parquet; ``extra_info`` is a struct column when any record has some."""
    _check(records)
    kinds = {isinstance(r.prompt, str) for r in records}
    if len(kinds) > 1:
        raise InvalidInputError("these records mix text prompts and chat-message prompts, which one Parquet "
                                "column cannot hold; write JSONL, or turn the text prompts into messages")
    columns = {"prompt_id": [r.prompt_id for r in records], "prompt": [r.prompt for r in records],
               "answer": [r.answer for r in records], "data_source": [r.data_source for r in records]}
    if any(r.extra_info for r in records):
        columns["extra_info"] = [r.extra_info for r in records]
    _write(path, _parquet_bytes(columns))


def write_verl_parquet(records: list[PromptRecord], path: str, *, split: str = "train",
                       ability: str = "math") -> None:
    """verl's RLVR row layout (see the module docstring), the format of every stage subset."""
    _check(records)
    columns = {
        "data_source": [r.data_source for r in records],
        "prompt": [as_messages(r.prompt) for r in records],
        "ability": [ability] * len(records),
        "reward_model": [{"style": "rule", "ground_truth": r.answer} for r in records],
        "extra_info": [_verl_extra(r, split, i) for i, r in enumerate(records)],
    }
    _write(path, _parquet_bytes(columns))


def _verl_extra(r: PromptRecord, split: str, index: int) -> dict:
    extra = {"split": split, "index": index, "prompt_id": r.prompt_id}
    extra.update({k: v for k, v in r.extra_info.items() if k not in extra})
    return extra


def _check(records: list[PromptRecord]) -> None:
    if not records:
        raise InvalidInputError("no records to write; a prompt file needs at least one prompt")
    seen: set[str] = set()
    for i, r in enumerate(records):
        if not isinstance(r, PromptRecord):
            raise InvalidInputError(f"record {i} is a {type(r).__name__}, not a PromptRecord")
        if r.prompt_id in seen:
            raise InvalidInputError(f"record {i} repeats prompt_id {r.prompt_id!r}; ids must be unique in a file")
        seen.add(r.prompt_id)


def _parquet_bytes(columns: dict[str, list]) -> bytes:
    arrays = {}
    for name, values in columns.items():
        try:
            arrays[name] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
            raise InvalidInputError(f"cannot store column {name!r} in Parquet ({e}); every record must give "
                                    "the same key the same type of value") from e
    sink = pa.BufferOutputStream()
    try:
        pq.write_table(pa.table(arrays), sink)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise InvalidInputError(f"cannot write these records as Parquet ({e}); an empty object inside "
                                "extra_info is a common cause: drop it or write JSONL") from e
    return sink.getvalue().to_pybytes()


def _write(path: str, data: bytes) -> None:
    fs, p = resolve(path)
    atomic_write_bytes(fs, p, data)
