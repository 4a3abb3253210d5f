"""Content fingerprint of a model folder: config, weights and tokenizer files.

A checkpoint's fingerprint is part of every stored trajectory set and gradient
split, so it must change whenever the function the model computes (or the way
text becomes ids) changes, and be cheap for multi-gigabyte checkpoints: files are
streamed, never read whole.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from cropi.errors import InvalidInputError, NotFoundError

CONFIG_FILES = ("config.json",)
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                   "tokenizer.model", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json")
# Bookkeeping keys a save rewrites without changing the model.
_VOLATILE_KEYS = ("transformers_version", "_name_or_path")
_CHUNK = 1 << 20
FINGERPRINT_CHARS = 16


def model_fingerprint(path: str | Path) -> str:
    """Short sha256 hex over the folder's config, weight and tokenizer files.

    JSON files are hashed in canonical form without ``transformers_version``, so
    re-saving an unchanged model with another transformers keeps its fingerprint.
    ``generation_config.json`` is left out: sampling defaults do not change the model.
    """
    folder = Path(path)
    if not folder.exists():
        raise NotFoundError(f"model folder {folder} does not exist: pass the path of a saved checkpoint")
    if not (folder / "config.json").is_file():
        raise InvalidInputError(f"{folder} is not a model folder: expected config.json (and weight "
                                "files) as written by save_pretrained")
    files = fingerprinted_files(folder)
    if not any(is_weight_file(f.name) for f in files):
        raise InvalidInputError(f"{folder} has no weight files: expected *.safetensors or *.bin "
                                "beside config.json")
    digest = hashlib.sha256()
    for f in files:
        rel = f.relative_to(folder).as_posix().encode()
        digest.update(len(rel).to_bytes(8, "little") + rel)
        _hash_file(digest, f)
    return digest.hexdigest()[:FINGERPRINT_CHARS]


def is_weight_file(name: str) -> bool:
    """Model weights as save_pretrained names them (not a trainer's optimizer or rng state)."""
    return name.endswith(".safetensors") or (name.startswith("pytorch_model") and name.endswith(".bin"))


def fingerprinted_files(folder: Path) -> list[Path]:
    """The files that make up a checkpoint's identity, in a fixed order."""
    names = set(CONFIG_FILES) | set(WEIGHT_INDEXES) | set(TOKENIZER_FILES)
    return sorted(f for f in folder.iterdir() if f.is_file() and (f.name in names or is_weight_file(f.name)))


def _hash_file(digest, f: Path) -> None:
    if f.suffix == ".json":
        blob = _canonical_json(f)
        digest.update(len(blob).to_bytes(8, "little") + blob)
        return
    digest.update(f.stat().st_size.to_bytes(8, "little"))
    with f.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)


def _canonical_json(f: Path) -> bytes:
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidInputError(f"{f} is not valid JSON ({e}): re-save the checkpoint") from e
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if k not in _VOLATILE_KEYS}
    return json.dumps(data, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()
