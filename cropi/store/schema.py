"""Checking an Arrow table against a dataset's schema before it is committed.

One error lists every problem at once (missing, unexpected and mistyped columns,
nulls where a value is required), so a caller fixes them in one go.
"""

from __future__ import annotations

import base64

import pyarrow as pa
import pyarrow.compute as pc

from cropi.errors import CorruptDataError, InvalidInputError


def same_type(a: pa.DataType, b: pa.DataType) -> bool:
    """Type equality that ignores list child names (Parquet renames ``item`` to ``element``)."""
    if pa.types.is_list(a) and pa.types.is_list(b):
        return same_type(a.value_type, b.value_type)
    if pa.types.is_fixed_size_list(a) and pa.types.is_fixed_size_list(b):
        return a.list_size == b.list_size and same_type(a.value_type, b.value_type)
    return a.equals(b)


def _null_problems(name: str, column, field: pa.Field) -> list[str]:
    """Nulls in a required column, or inside the lists of a column whose items are required."""
    out = [name] if not field.nullable and column.null_count else []
    t = field.type
    if (pa.types.is_list(t) or pa.types.is_fixed_size_list(t)) and not t.value_field.nullable:
        out += _null_problems(f"{name}[]", pc.list_flatten(column), t.value_field)
    return out


def schema_problems(table: pa.Table, schema: pa.Schema) -> list[str]:
    """Every way ``table`` fails to match ``schema``; empty if it matches."""
    have = {f.name: f for f in table.schema}
    missing = [f.name for f in schema if f.name not in have]
    extra = [n for n in have if schema.get_field_index(n) < 0]
    wrong = [f"{f.name} is {have[f.name].type}, expected {f.type}" for f in schema
             if f.name in have and not same_type(have[f.name].type, f.type)]
    problems = []
    if missing:
        problems.append(f"missing columns {missing}")
    if extra:
        problems.append(f"unexpected columns {extra}")
    if wrong:
        problems.append("wrong types: " + "; ".join(wrong))
    if not problems:
        nulls = [p for f in schema for p in _null_problems(f.name, table.column(f.name), f)]
        if nulls:
            problems.append(f"nulls in required columns {nulls}")
    return problems


def check_table(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with its columns in schema order and the schema's exact types.

    Raises InvalidInputError naming every missing, unexpected or mistyped column.
    """
    if not isinstance(table, pa.Table):
        raise InvalidInputError(f"expected a pyarrow.Table, got {type(table).__name__}")
    problems = schema_problems(table, schema)
    if problems:
        raise InvalidInputError("table does not match the dataset schema: " + "; ".join(problems)
                                + f". Build it with the dataset's schema: {schema.names}")
    return conform(table, schema)


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """Reorder and relabel (list child names, nullability) to ``schema``; no data copied."""
    table = table.select(schema.names)
    return table if table.schema.equals(schema) else table.cast(schema)


def encode_schema(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def decode_schema(text: str, where: str) -> pa.Schema:
    try:
        return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))
    except Exception as e:  # bad base64 or bad flatbuffer: either way the manifest is damaged
        raise CorruptDataError(f"{where}: stored schema cannot be decoded ({e}); "
                               "restore the manifest or delete the dataset and recompute") from e
