"""The prompt record, its stable id, and the fingerprint of a prompt set.

A record is one training or validation prompt with its verifiable answer. Its
``prompt`` is either plain text or a list of chat messages (``role`` and
``content`` strings). Ids that a file does not give are derived from the content
with sha256, so the same prompt gets the same id in every process and on every
machine.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

ROLES = ("system", "user", "assistant", "tool")

Messages = list[dict[str, str]]


class PromptRecord(BaseModel):
    """One prompt with its ground-truth answer.

    ``extra_info`` is free-form metadata carried through every format. Keys whose
    value is ``None`` are dropped (at any depth, in chat messages too): Parquet
    structs cannot tell a missing key from a null one, so treating them alike
    keeps round trips exact.
    """

    model_config = ConfigDict(extra="forbid")

    prompt_id: str
    prompt: Union[str, Messages]
    answer: str
    data_source: str = ""
    extra_info: dict[str, Any] = Field(default_factory=dict)

    @field_validator("prompt_id")
    @classmethod
    def _id_not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("prompt_id is empty")
        return v

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, v: Any) -> Any:
        # Checked here, before pydantic tries each branch of the union, so a bad
        # message gets one plain sentence instead of two type errors.
        if isinstance(v, str):
            return v
        if not isinstance(v, (list, tuple)):
            raise ValueError(f"prompt must be text or a list of chat messages, got {type(v).__name__}")
        messages = []
        for i, m in enumerate(v):
            if not isinstance(m, dict):
                raise ValueError(f"chat message {i} must be an object with 'role' and 'content', "
                                 f"got {type(m).__name__}")
            m = drop_none(m)
            for k, x in m.items():
                if not isinstance(x, str):
                    raise ValueError(f"chat message {i}: {k!r} must be a string, got {type(x).__name__}")
            messages.append(m)
        return messages

    @field_validator("prompt")
    @classmethod
    def _prompt_well_formed(cls, v: Union[str, Messages]) -> Union[str, Messages]:
        if isinstance(v, str):
            if not v.strip():
                raise ValueError("prompt is empty")
            return v
        check_messages(v)
        return v

    @field_validator("answer")
    @classmethod
    def _answer_not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("answer is empty")
        return v

    @field_validator("extra_info", mode="before")
    @classmethod
    def _drop_null_extra(cls, v: Any) -> Any:
        return drop_none(v) if isinstance(v, dict) else v


def check_messages(messages: Messages) -> None:
    """Raise ValueError unless ``messages`` is a usable chat: known roles, some content."""
    if not messages:
        raise ValueError("prompt has no chat messages")
    for i, m in enumerate(messages):
        missing = [k for k in ("role", "content") if k not in m]
        if missing:
            raise ValueError(f"chat message {i} has no {' or '.join(repr(k) for k in missing)}")
        if m["role"] not in ROLES:
            raise ValueError(f"chat message {i} has role {m['role']!r}; expected one of {', '.join(ROLES)}")
    if not any(m["content"].strip() for m in messages):
        raise ValueError("prompt is empty (every chat message has blank content)")


def as_messages(prompt: Union[str, Messages]) -> Messages:
    """The prompt as chat messages: plain text becomes one user message."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [dict(m) for m in prompt]


def canonical_json(obj: Any) -> bytes:
    """Sorted-key, compact UTF-8 JSON: equal objects give equal bytes everywhere."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def stable_prompt_id(prompt: Union[str, Messages], answer: str) -> str:
    """``sha256(canonical json of {prompt, answer})[:16]``: the id of a record a file gives none for."""
    return hashlib.sha256(canonical_json({"prompt": prompt, "answer": answer})).hexdigest()[:16]


def prompts_fingerprint(records: list[PromptRecord]) -> str:
    """sha256 over (prompt_id, prompt, answer, data_source) of every record, in id order.

    Order-insensitive, and blind to ``extra_info`` (metadata that changes neither
    what is sampled nor how it is rewarded), so the same prompt set loaded from
    JSONL, Parquet or verl Parquet has the same fingerprint.
    """
    h = hashlib.sha256(b"cropi.prompts.v1\n")
    for r in sorted(records, key=lambda r: r.prompt_id):
        h.update(canonical_json([r.prompt_id, r.prompt, r.answer, r.data_source]))
        h.update(b"\n")
    return h.hexdigest()


def drop_none(v: Any) -> Any:
    """``v`` with every dict key whose value is None removed, inside lists too."""
    if isinstance(v, dict):
        return {k: drop_none(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [drop_none(x) for x in v]
    return v
