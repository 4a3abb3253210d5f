"""Caller option models derived from the library's options models, so every option is defined once.

``caller_model(Library, policy)`` is a closed model with each field of ``Library``, optional (unset:
the library's default holds), carrying the library's own type, bounds, description and accepted
old names. On top, the service's ``Policy``:

- ``refused``: fields a caller may not set (the service fills them, or they are the operator's),
  refused by name with the reason;
- free-form fields (text, lists, dicts, models: paths, commands, code) are refused by name unless
  the policy ``vetted`` them with constraints of its own; numbers, switches and choices pass. So a
  new library option reaches callers when it is a bounded number or a choice, and is refused by
  name when it could name a file or a program, without editing anything here;
- ``tighter``: bounds a shared server adds (the library's still apply, so they can only narrow);
- ``nested``: the caller model standing for a nested library model.

Unless the service fills some of its required fields, the derived model validates the caller's
choices through ``Library`` itself, so the library's validators (cross-field ones included) judge
them at the HTTP edge, before a job is queued.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Mapping, Optional, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator
from pydantic.json_schema import SkipJsonSchema

from cropi.errors import format_validation_error

CLOSED_TYPES = (bool, int, float, type(None))


@dataclass(frozen=True)
class Policy:
    refused: Mapping[str, str] = field(default_factory=dict)  # field -> why a caller may not set it
    vetted: Mapping[str, tuple] = field(default_factory=dict)  # free-form field -> constraints that make it safe
    tighter: Mapping[str, tuple] = field(default_factory=dict)  # field -> constraints added on a shared server
    nested: Mapping[str, Any] = field(default_factory=dict)  # field -> annotation replacing the library's


class Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


def is_closed(annotation: Any) -> bool:
    """Whether values of ``annotation`` are only numbers, booleans, choices or None (nothing free-form)."""
    origin = get_origin(annotation)
    if origin is Literal:
        return True
    if origin is Annotated:
        return is_closed(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return all(is_closed(a) for a in get_args(annotation))
    return annotation in CLOSED_TYPES


def _refuse(name: str, why: str):
    def check(value: Any) -> Any:
        raise ValueError(f"{name} cannot be set by a caller: {why}")

    # present so the error names the field; absent from the schema callers read
    return SkipJsonSchema[Annotated[Optional[Any], AfterValidator(check)]], Field(None, exclude=True)


def caller_model(library: type[BaseModel], policy: Policy = Policy(), *, name: str,
                 extra: Mapping[str, Any] | None = None) -> type[BaseModel]:
    """The closed caller model of ``library`` under ``policy`` (``extra``: more fields, as create_model takes)."""
    unknown = sorted(set(policy.refused) | set(policy.vetted) | set(policy.tighter) | set(policy.nested))
    unknown = [f for f in unknown if f not in library.model_fields]
    if unknown:
        raise TypeError(f"the {name} policy names fields {unknown} that {library.__name__} does not have")
    fields: dict[str, Any] = {}
    for key, info in library.model_fields.items():
        if key in policy.refused:
            fields[key] = _refuse(key, policy.refused[key])
            continue
        annotation = policy.nested.get(key, info.annotation)
        if key not in policy.nested and key not in policy.vetted and not is_closed(annotation):
            kind = getattr(annotation, "__name__", annotation)
            fields[key] = _refuse(key, f"it is free-form ({kind}) and the service has not vetted it; ask the operator")
            continue
        constraints = (*info.metadata, *policy.vetted.get(key, ()), *policy.tighter.get(key, ()))
        typed = Annotated[(annotation, *constraints)] if constraints else annotation
        fields[key] = (Optional[typed], Field(None, description=info.description,
                                              validation_alias=info.validation_alias))
    # a library model with required fields the service fills is validated whole where the service builds it
    left_to_service = [k for k in policy.refused if library.model_fields[k].is_required()]
    validators = {} if left_to_service else {"_through_library": _through(library)}
    return create_model(name, __base__=Closed, __doc__=f"{library.__doc__ or ''}\n\nDerived from the library's "
                        f"``{library.__module__}.{library.__name__}``: unset fields keep its defaults.",
                        __validators__=validators, **fields, **(extra or {}))


def library_field(library: type[BaseModel], key: str, *tighter: Any, name: str | None = None) -> Any:
    """The type of ``library``'s field ``key`` for a request field that stands for it: the library's type,
    bounds and description, plus the ``tighter`` bounds of a shared server (the library's still apply, so
    they can only narrow). ``name``, the request's name for it, must be one the library accepts: the
    service spells no name of its own."""
    info = library.model_fields[key]
    alias = info.validation_alias
    accepted = {key, *(c for c in getattr(alias, "choices", [alias]) if isinstance(c, str))}
    if name is not None and name not in accepted:
        raise TypeError(f"{library.__name__}.{key} is not accepted as {name!r}: use one of {sorted(accepted)}")
    return Annotated[(info.annotation, *info.metadata, *tighter, Field(description=info.description))]


def library_default(library: type[BaseModel], key: str) -> Any:
    """The library's default of field ``key`` (a request field that stands for it defaults alike)."""
    return library.model_fields[key].get_default(call_default_factory=True)


def _through(library: type[BaseModel]):
    def check(self: BaseModel) -> BaseModel:
        try:
            library.model_validate({k: v for k, v in set_fields(self).items() if k in library.model_fields})
        except ValidationError as e:  # the library's message, as one line under this model's place
            raise ValueError(format_validation_error(e, library.__name__)) from None
        return self

    return model_validator(mode="after")(check)


def set_fields(model: Optional[BaseModel]) -> dict[str, Any]:
    """The fields a caller set, by the library's names (unset ones are left to the library's defaults)."""
    return model.model_dump(exclude_none=True) if model is not None else {}
