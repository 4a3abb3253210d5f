"""Content fingerprint of a model folder: config, weights and tokenizer files.

A checkpoint's fingerprint is part of every stored trajectory set and gradient
split, so it must change whenever the function the model computes (or the way
text becomes ids) changes, and be cheap for multi-gigabyte checkpoints: files are
streamed, never read whole.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections import OrderedDict
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
# A folder's fingerprint is kept, per process, beside the stat of every file it hashed (size, mtime, inode,
# ...), and hashed again when any of them differs. Scoring one checkpoint asks for it about seven times (its
# name, each split's gradients, the refresh, the collection): at 1.5B in bfloat16 that is 3 GB read each time.
# Only files last written RACY_S or longer before the hash are trusted to it: a rewrite within the clock's tick
# could keep the old mtime (git's "racy" entries), and a folder still being written is hashed every time.
RACY_S = 2.0
_KEPT = 256  # folders remembered (least recently asked first out)
_memo: OrderedDict[str, tuple[tuple, str]] = OrderedDict()
_memo_lock = threading.Lock()


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
    where, seen = str(folder.resolve()), _stats(files)
    with _memo_lock:
        kept = _memo.get(where)
        if kept is not None and kept[0] == seen:
            _memo.move_to_end(where)
            return kept[1]
    started = time.time()
    digest = hashlib.sha256()
    for f in files:
        rel = f.relative_to(folder).as_posix().encode()
        digest.update(len(rel).to_bytes(8, "little") + rel)
        _hash_file(digest, f)
    fingerprint = digest.hexdigest()[:FINGERPRINT_CHARS]
    settled = all(stat[3] <= (started - RACY_S) * 1e9 for stat in seen)
    if settled and _stats(files) == seen:  # nothing written while it was read
        with _memo_lock:
            _memo[where] = (seen, fingerprint)
            _memo.move_to_end(where)
            while len(_memo) > _KEPT:
                _memo.popitem(last=False)
    return fingerprint


def _stats(files: list[Path]) -> tuple:
    """What changes when a file is rewritten, replaced or moved: name, size, inode, mtime, ctime."""
    out = []
    for f in files:
        st = os.stat(f)
        out.append((f.name, st.st_size, st.st_ino, max(st.st_mtime_ns, st.st_ctime_ns), st.st_mtime_ns))
    return tuple(out)


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
