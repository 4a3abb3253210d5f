"""Checks that stop a job early with a message a person can act on."""

from __future__ import annotations

from cropi.errors import MismatchError
from cropi.utils.hashing import SPACED, short_hash


def tokenizer_fingerprint(tokenizer) -> str:
    """Content hash of the vocabulary and special tokens (file layout independent)."""
    vocab = sorted(tokenizer.get_vocab().items())
    specials = sorted(str(t) for t in tokenizer.all_special_tokens)
    # spaced and non-ASCII: the form trajectory stores already record
    return short_hash([vocab, specials], separators=SPACED, ensure_ascii=False)


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

