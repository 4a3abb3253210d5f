"""Turn a prompt record's text or chat messages into the token ids a backend samples from."""

from __future__ import annotations

from cropi.errors import InvalidInputError


def render_prompt(tokenizer, prompt: str | list[dict]) -> list[int]:
    """Token ids of the prompt through the chat template, with the assistant turn opened.

    A plain string is one user message. A tokenizer without a chat template is an
    error: cropi never invents a template the model was not trained with.
    """
    messages = _messages(prompt)
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidInputError("the tokenizer has no chat template: save one with the checkpoint "
                                "(tokenizer.chat_template) so prompts render as the model was trained")
    from jinja2 import TemplateError

    try:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                            return_dict=False)
    except TemplateError as e:  # the template's raise_exception() says why
        raise InvalidInputError(f"the chat template rejected the prompt: {e}") from e
    if hasattr(ids, "keys"):  # some transformers versions return a BatchEncoding regardless
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def check_prompt_fits(n_prompt_tokens: int, max_new_tokens: int, max_model_len: int, prompt_id: str) -> None:
    """Raise if prompt plus the longest response would not fit the model's context."""
    if n_prompt_tokens + max_new_tokens > max_model_len:
        raise InvalidInputError(
            f"prompt {prompt_id!r} has {n_prompt_tokens} tokens; with max_new_tokens={max_new_tokens} that is "
            f"{n_prompt_tokens + max_new_tokens} > the model's context of {max_model_len} tokens: shorten or "
            "drop the prompt, or lower max_new_tokens")


def _messages(prompt: str | list[dict]) -> list[dict]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if not isinstance(prompt, list) or not prompt:
        raise InvalidInputError(f"a prompt must be text or a non-empty list of chat messages, got {type(prompt).__name__}")
    for i, m in enumerate(prompt):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise InvalidInputError(f"chat message {i} must be a dict with string 'role' and 'content', got {m!r}")
    return [{"role": m["role"], "content": m["content"]} for m in prompt]
