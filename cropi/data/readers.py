"""Load a prompt set from JSONL, plain Parquet or verl RLVR Parquet.

The format is told by the columns (keys, for JSONL), never guessed per row:

- plain contract: ``prompt``, ``answer``, optional ``prompt_id``, ``data_source``,
  ``extra_info``;
- verl RLVR: ``prompt`` (chat messages), ``reward_model.ground_truth``,
  ``data_source``, ``extra_info``; the id comes from ``prompt_id``,
  ``extra_info.prompt_id`` or ``extra_info.index``, in that order.

Every bad row is collected before anything is returned, so one error names them
all (the first ten, and how many in total).
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Iterable, Optional

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pydantic import ValidationError

from cropi.data.records import PromptRecord, stable_prompt_id
from cropi.errors import InvalidInputError
from cropi.utils.fsio import resolve

SHOWN = 10  # bad rows spelled out in an error; the rest are counted
MAX_DEPTH = 32  # nesting of lists/objects in one row; a prompt row needs a handful
_TOO_DEEP = object()
# extra_info keys that write_verl_parquet sets itself; stripped on load so records round-trip
VERL_RESERVED = ("split", "index", "prompt_id")
EXTENSIONS = {".jsonl": "jsonl", ".parquet": "parquet", ".pq": "parquet"}


class PromptFileError(InvalidInputError):
    """A prompt file that cannot be read at all: missing, unreadable, unknown kind."""


class BadRowsError(InvalidInputError):
    """Rows of a prompt file that are not valid records; ``problems`` lists every one."""

    def __init__(self, message: str, problems: list["RowProblem"]):
        super().__init__(message)
        self.problems = problems


@dataclass(frozen=True)
class RowProblem:
    position: int  # JSONL line number (from 1) or Parquet row number (from 0)
    where: str  # "line 7" or "row 6"
    prompt_id: Optional[str]
    reason: str

    def __str__(self) -> str:
        ident = f" (id {self.prompt_id!r})" if self.prompt_id is not None else ""
        return f"{self.where}{ident}: {self.reason}"


# Prompt files parsed within a ``reading_once`` block: (path, size, mtime) -> records.
_ONCE: ContextVar[Optional[dict]] = ContextVar("cropi_prompt_files", default=None)


@contextmanager
def reading_once():
    """Within the block, each prompt file is parsed once: a step that consults one file several
    times (the score step reads the pool for its fingerprint, its check, its labels and a refresh:
    3.4 s a read for 100k prompts) pays for one. Keyed by path, size and modification time, so a
    file edited meanwhile is read again. Scoped to the block, not the process: no long-lived
    process (the service) keeps a pool's records alive."""
    token = _ONCE.set({})
    try:
        yield
    finally:
        _ONCE.reset(token)


def load_prompts(path: str) -> list[PromptRecord]:
    """Read a prompt set (``.jsonl``, ``.parquet``) into records, in file order.

    ``path`` is a local path or a URI pyarrow.fs understands. Raises
    ``PromptFileError`` for a file that cannot be read and ``BadRowsError``
    naming the rows at fault (duplicate ids, missing or empty answers, empty
    prompts, malformed chat messages, bad JSON lines).
    """
    kind = _kind(path)
    fs, p = resolve(path)
    info = _check_is_file(fs, p, path)
    once = _ONCE.get()
    if once is None:
        return _parse(fs, p, path, kind)
    key = (path, info.size, info.mtime_ns)
    if key not in once:
        once[key] = _parse(fs, p, path, kind)
    return list(once[key])


def _parse(fs: pafs.FileSystem, p: str, path: str, kind: str) -> list[PromptRecord]:
    rows, problems = _read_jsonl(fs, p, path) if kind == "jsonl" else _read_parquet(fs, p, path)
    verl = _is_verl(path, [r for _, _, r in rows])
    records: list[tuple[int, str, PromptRecord]] = []
    for pos, where, row in rows:
        record, reason = _to_record(row, verl)
        if reason is not None:
            problems.append(RowProblem(pos, where, _raw_id(row, verl), reason))
        else:
            records.append((pos, where, record))
    problems.extend(_duplicates(records))
    if problems:
        problems.sort(key=lambda p: p.position)
        raise BadRowsError(_summary(path, kind, problems), problems)
    if not records:
        raise PromptFileError(f"{path} holds no prompts; give a file with at least one row")
    return [r for _, _, r in records]


def _kind(path: str) -> str:
    name = str(path).lower()
    for ext, kind in EXTENSIONS.items():
        if name.endswith(ext):
            return kind
    raise PromptFileError(f"{path}: unknown prompt file type; name it *.jsonl (one JSON object a line) "
                          f"or *.parquet (plain or verl RLVR layout)")


def _check_is_file(fs: pafs.FileSystem, p: str, path: str) -> pafs.FileInfo:
    try:
        info = fs.get_file_info(p)
    except OSError as e:
        raise PromptFileError(f"cannot read {path}: {e}") from e
    if info.type == pafs.FileType.NotFound:
        raise PromptFileError(f"{path} does not exist; check the path")
    if info.type != pafs.FileType.File:
        raise PromptFileError(f"{path} is not a file; give the path of one .jsonl or .parquet file")
    return info


Rows = list[tuple[int, str, dict]]  # (position, "line 3" / "row 2", the row)


def _read_jsonl(fs, p: str, path: str) -> tuple[Rows, list[RowProblem]]:
    try:
        with fs.open_input_stream(p) as f:
            raw = f.read()
    except OSError as e:
        raise PromptFileError(f"cannot read {path}: {e}") from e
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise PromptFileError(f"{path}: line {line} is not UTF-8 text; save the file as UTF-8") from e
    rows, problems = [], []
    for n, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            problems.append(RowProblem(n, f"line {n}", None, f"not valid JSON ({e.msg} at column {e.colno})"))
            continue
        except RecursionError:  # the decoder recursed past Python's limit: far deeper than any prompt row
            obj = _TOO_DEEP
        if obj is _TOO_DEEP or too_deep(obj):
            problems.append(RowProblem(n, f"line {n}", None, f"nested more than {MAX_DEPTH} lists/objects deep; "
                                       "a prompt row is an object of strings and shallow extra_info"))
            continue
        if not isinstance(obj, dict):
            problems.append(RowProblem(n, f"line {n}", None, f"expected a JSON object, got {type(obj).__name__}"))
            continue
        rows.append((n, f"line {n}", obj))
    return rows, problems


def _read_parquet(fs, p: str, path: str) -> tuple[Rows, list[RowProblem]]:
    try:
        with fs.open_input_file(p) as f:
            table = pq.read_table(f)
    except (pa.ArrowException, OSError) as e:
        raise PromptFileError(f"{path} is not a readable Parquet file ({e}); rewrite it or give JSONL") from e
    rows, problems = [], []
    for i, row in enumerate(table.to_pylist()):
        if too_deep(row):
            problems.append(RowProblem(i, f"row {i}", None, f"nested more than {MAX_DEPTH} lists/structs deep"))
        else:
            rows.append((i, f"row {i}", row))
    return rows, problems


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether lists/dicts in ``value`` nest deeper than ``limit`` (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list, tuple)):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list, tuple)))
    return False


def _is_verl(path: str, rows: Iterable[dict]) -> bool:
    columns: set[str] = set()
    for r in rows:
        columns.update(r)
    if "answer" in columns and "reward_model" in columns:
        raise PromptFileError(f"{path} has both 'answer' and 'reward_model' columns, so its layout is ambiguous; "
                              "keep 'answer' (plain layout) or 'reward_model.ground_truth' (verl layout)")
    return "reward_model" in columns


def _to_record(row: dict, verl: bool) -> tuple[Optional[PromptRecord], Optional[str]]:
    """The record of one row, or the reason it is not one."""
    fields, reason = _verl_fields(row) if verl else _plain_fields(row)
    if reason is not None:
        return None, reason
    if fields["prompt_id"] is None:
        fields["prompt_id"] = "pending"  # replaced below, once the prompt is known to be valid
        derive = True
    else:
        derive = False
    try:
        record = PromptRecord(**fields)
    except ValidationError as e:
        return None, _explain(e)
    if derive:
        record = record.model_copy(update={"prompt_id": stable_prompt_id(record.prompt, record.answer)})
    return record, None


def _plain_fields(row: dict) -> tuple[dict, Optional[str]]:
    answer, reason = _text(row.get("answer"), "answer")
    if reason:
        return {}, reason
    pid, reason = _id(row.get("prompt_id"), "prompt_id")
    if reason:
        return {}, reason
    extra = row.get("extra_info")
    if extra is not None and not isinstance(extra, dict):
        return {}, f"extra_info must be an object, got {type(extra).__name__}"
    return _common(row, pid, answer, extra or {})


def _verl_fields(row: dict) -> tuple[dict, Optional[str]]:
    rm = row.get("reward_model")
    if not isinstance(rm, dict):
        return {}, "reward_model is missing or not an object; verl rows need reward_model.ground_truth"
    answer, reason = _text(rm.get("ground_truth"), "reward_model.ground_truth")
    if reason:
        return {}, reason
    extra = row.get("extra_info")
    if extra is not None and not isinstance(extra, dict):
        return {}, f"extra_info must be an object, got {type(extra).__name__}"
    extra = dict(extra or {})
    for name, raw in (("prompt_id", row.get("prompt_id")), ("extra_info.prompt_id", extra.get("prompt_id")),
                      ("extra_info.index", extra.get("index"))):
        if raw is not None:
            pid, reason = _id(raw, name)
            break
    else:
        pid, reason = None, None
    if reason:
        return {}, reason
    for key in VERL_RESERVED:
        extra.pop(key, None)
    return _common(row, pid, answer, extra)


def _common(row: dict, pid: Optional[str], answer: str, extra: dict) -> tuple[dict, Optional[str]]:
    if row.get("prompt") is None:
        return {}, "prompt is missing"
    source = row.get("data_source")
    if source is not None and not isinstance(source, str):
        return {}, f"data_source must be a string, got {type(source).__name__}"
    return {"prompt_id": pid, "prompt": row["prompt"], "answer": answer,
            "data_source": source or "", "extra_info": extra}, None


def _text(v: Any, name: str) -> tuple[Optional[str], Optional[str]]:
    """Answers may be numbers in JSON; they are kept as their text."""
    if v is None:
        return None, f"{name} is missing"
    if isinstance(v, bool) or not isinstance(v, (str, int, float)):
        return None, f"{name} must be a string (or a number), got {type(v).__name__}"
    return str(v), None


def _id(v: Any, name: str) -> tuple[Optional[str], Optional[str]]:
    if v is None:
        return None, None
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        return None, f"{name} must be a string or an integer, got {type(v).__name__}"
    return str(v), None


def _raw_id(row: dict, verl: bool) -> Optional[str]:
    """The row's own id, if it has a usable one, for naming it in an error."""
    candidates = [row.get("prompt_id")]
    extra = row.get("extra_info")
    if verl and isinstance(extra, dict):
        candidates += [extra.get("prompt_id"), extra.get("index")]
    for c in candidates:
        if isinstance(c, (str, int)) and not isinstance(c, bool):
            return str(c)
    return None


def _explain(e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        msg = err["msg"].removeprefix("Value error, ")
        field = str(err["loc"][0]) if err["loc"] else ""
        parts.append(msg if field and field in msg else f"{field}: {msg}" if field else msg)
    return "; ".join(parts)


def _duplicates(records: list[tuple[int, str, PromptRecord]]) -> list[RowProblem]:
    first: dict[str, str] = {}
    problems = []
    for pos, where, r in records:
        if r.prompt_id in first:
            problems.append(RowProblem(pos, where, r.prompt_id,
                                       f"duplicate prompt_id (first at {first[r.prompt_id]}); "
                                       "give each row a unique id, or drop the repeated prompt"))
        else:
            first[r.prompt_id] = where
    return problems


def _summary(path: str, kind: str, problems: list[RowProblem]) -> str:
    counting = "lines counted from 1" if kind == "jsonl" else "rows counted from 0"
    shown = "\n  ".join(str(p) for p in problems[:SHOWN])
    more = f"\n  ... and {len(problems) - SHOWN} more" if len(problems) > SHOWN else ""
    return (f"{path}: {len(problems)} invalid row(s) ({counting}); fix or drop them and load again:\n  "
            f"{shown}{more}")
