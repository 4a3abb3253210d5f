"""Command-line flags derived from the options models (pydantic), so the CLI never restates a default.

``add_model_args`` adds one ``--flag`` per field of a model (nested models flattened),
with the field's type, choices, description and default in its help line; argparse
keeps no default of its own (``SUPPRESS``), so a flag left out is left out of the
values and the model applies its own default. ``model_values`` turns parsed flags back
into the nested dict the model validates.
"""

from __future__ import annotations

import argparse
import types
import typing
from typing import Any, Literal, Union

from pydantic import BaseModel
from pydantic_core import PydanticUndefined


def add_model_args(parser, model: type[BaseModel], *, rename: dict[str, str] | None = None,
                   skip: tuple[str, ...] = (), prefix: tuple[str, ...] = ()) -> None:
    """One flag per field of ``model``: ``--field-name``, or ``rename[dotted path]`` (a list: aliases).

    A nested model's fields are flattened under their own names (rename to resolve clashes);
    paths in ``skip`` (dotted) get no flag.
    """
    rename = rename or {}
    for name, field in model.model_fields.items():
        path = (*prefix, name)
        dotted = ".".join(path)
        if dotted in skip:
            continue
        inner = _unwrap(field.annotation)
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            add_model_args(parser, inner, rename=rename, skip=skip, prefix=path)
            continue
        flags = rename.get(dotted, name.replace("_", "-"))
        flags = [flags] if isinstance(flags, str) else list(flags)
        kwargs = {"metavar": flags[0].upper().replace("-", "_"), **_kind(inner)}
        if "choices" in kwargs or "action" in kwargs and kwargs["action"] is argparse.BooleanOptionalAction:
            kwargs.pop("metavar")
        required = field.is_required()
        help_text = field.description or name.replace("_", " ")  # the model spells each help once
        if not required:
            help_text += f" (default: {_default(field)})"
        parser.add_argument(*(f"--{f}" for f in flags), dest=dotted, default=argparse.SUPPRESS,
                            required=required, help=help_text, **kwargs)


def model_values(args: argparse.Namespace, prefix: str = "") -> dict[str, Any]:
    """The given flags as a nested dict (dotted dests split), those under ``prefix`` only."""
    out: dict[str, Any] = {}
    for dest, value in vars(args).items():
        if "." not in dest and not prefix and dest in _RESERVED:
            continue
        if prefix:
            if not dest.startswith(prefix + "."):
                continue
            dest = dest[len(prefix) + 1:]
        node = out
        *parents, leaf = dest.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


_RESERVED = {"command", "json", "ray", "workers", "gpus_per_worker", "limit", "root", "config", "shard"}


def _default(field) -> Any:
    if field.default is not PydanticUndefined:
        value = field.default
    elif field.default_factory is not None:
        value = field.default_factory()
    else:
        return None
    return "none" if value is None else value


def _unwrap(annotation):
    """``Optional[X]`` -> X."""
    if typing.get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return _unwrap(args[0])
    return annotation


def _kind(annotation) -> dict:
    origin = typing.get_origin(annotation)
    if origin is Literal:
        choices = list(typing.get_args(annotation))
        return {"choices": choices, "type": type(choices[0])}
    if annotation is bool:
        return {"action": argparse.BooleanOptionalAction}
    if origin is dict:
        return {"action": _KeyValue, "metavar": "NAME=PATH"}
    if origin is list:
        return {"type": _comma_list, "metavar": "A,B,..."}
    if annotation in (int, float, str):
        return {"type": annotation}
    return {"type": str}


def _comma_list(text: str) -> list[str]:
    return [v for v in text.split(",") if v]


class _KeyValue(argparse.Action):
    """``--flag NAME=PATH``, repeatable: a dict."""

    def __call__(self, parser, namespace, values, option_string=None):
        name, sep, value = values.partition("=")
        if not sep or not name or not value:
            parser.error(f"{option_string} takes NAME=PATH, got {values!r}")
        current = getattr(namespace, self.dest, None)
        current = dict(current) if isinstance(current, dict) else {}
        current[name] = value
        setattr(namespace, self.dest, current)
