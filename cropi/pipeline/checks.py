"""Checks that stop a job early with a message a person can act on."""

from __future__ import annotations

import hashlib
import json

from cropi.errors import MismatchError


def tokenizer_fingerprint(tokenizer) -> str:
    """Content hash of the vocabulary and special tokens (file layout independent)."""
    vocab = sorted(tokenizer.get_vocab().items())
    specials = sorted(str(t) for t in tokenizer.all_special_tokens)
    blob = json.dumps([vocab, specials], ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def check_tokenizer_matches(trajectory_identity: dict, tokenizer, model_path: str) -> None:
    """Token ids in the trajectories only mean something under the tokenizer that made them."""
    recorded = trajectory_identity.get("tokenizer")
    if recorded is None:
        return
    actual = tokenizer_fingerprint(tokenizer)
    if recorded != actual:
        raise MismatchError(
            f"tokenizer of {model_path} (fingerprint {actual}) differs from the one the trajectories "
            f"were collected with ({recorded}): score a checkpoint of the same model family, or "
            "collect trajectories with this checkpoint (cropi collect)")


def check_token_ids_fit(traj, vocab_size: int) -> None:
    top = max([max(traj.prompt_token_ids, default=0)] + [max(r, default=0) for r in traj.responses])
    if top >= vocab_size:
        raise MismatchError(
            f"prompt {traj.prompt_id}: token id {top} is outside the model's vocabulary ({vocab_size}); "
            "the trajectories were made with another tokenizer")

