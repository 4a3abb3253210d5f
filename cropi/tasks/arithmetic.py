"""A synthetic verifiable task for the demo: arithmetic problems of six skills, three levels.

Skills and what the level (1..3) controls::

    add, sub    two operands of level+1 digits
    mul         a level-digit number times a 2-digit number
    multistep   level+2 numbers (1..12) joined by +, -, * (parenthesized where needed); every
                intermediate result stays within +-1000
    max         the largest of level+2 numbers of level+1 digits (level 3: some negative)
    mod         remainder of a (level+1)-digit number by a 1-digit (level 1) or 2-digit divisor

Splits (``make_task_splits``): ``pool`` spreads evenly over every skill and
level; ``val_a`` targets multiplication (mostly ``mul``, some ``mod``); ``val_b``
targets multi-step expressions (mostly ``multistep``, some ``sub``); ``test`` is
half ``val_a``'s mixture, half ``val_b``'s. ``add`` and ``max`` appear only in the
pool: training on them should help the targets least, which is what a good
influence ranking has to find out. No problem appears twice, within or across
splits. Every record keeps its expression in ``extra_info["expr"]`` so
``solution_text`` can work it out step by step.
"""

from __future__ import annotations

import ast
import random
from typing import Callable

from cropi.data.records import PromptRecord, stable_prompt_id
from cropi.errors import InvalidInputError
from cropi.tasks.base import TaskSizeError, apportion, draw_cells  # noqa: F401 (re-exported)

SKILLS = ("add", "sub", "mul", "multistep", "max", "mod")
LEVELS = (1, 2, 3)
TARGETS = {
    "val_a": {"mul": 0.75, "mod": 0.25},
    "val_b": {"multistep": 0.75, "sub": 0.25},
}
INSTRUCTION = "Put the final answer in \\boxed{}."
MAX_INTERMEDIATE = 1000  # multistep results stay small enough for a tiny model
_TRIES = 1000  # draws per problem before a cell counts as exhausted


# ---------------------------------------------------------------- problems


def _digits(rng: random.Random, n: int) -> int:
    return rng.randint(10 ** (n - 1), 10**n - 1)


def _add(rng, level):
    return f"{_digits(rng, level + 1)} + {_digits(rng, level + 1)}"


def _sub(rng, level):
    return f"{_digits(rng, level + 1)} - {_digits(rng, level + 1)}"


def _mul(rng, level):
    return f"{_digits(rng, level)} * {_digits(rng, 2)}"


def _mod(rng, level):
    divisor = rng.randint(2, 9) if level == 1 else rng.randint(11, 99)
    return f"{_digits(rng, level + 1)} % {divisor}"


def _max(rng, level):
    values = [_digits(rng, level + 1) for _ in range(level + 2)]
    if level == 3:
        values = [v * rng.choice((1, -1)) for v in values]
    return f"max({', '.join(map(str, values))})"


_PREC = {"+": 1, "-": 1, "*": 2}


def _multistep(rng, level):
    while True:
        text, _ = _render(_tree(rng, level + 2))
        if all(abs(v) <= MAX_INTERMEDIATE for v in _intermediates(text)):
            return text


def _tree(rng, n):
    """A random expression tree over ``n`` leaves: an int, or (op, left, right)."""
    if n == 1:
        return rng.randint(1, 12)
    k = rng.randint(1, n - 1)
    return (rng.choice("+-*"), _tree(rng, k), _tree(rng, n - k))


def _render(node) -> tuple[str, int]:
    """Text with only the parentheses the evaluation order needs, and its precedence."""
    if isinstance(node, int):
        return str(node), 3
    op, left, right = node
    lt, lp = _render(left)
    rt, rp = _render(right)
    if lp < _PREC[op]:
        lt = f"({lt})"
    if rp < _PREC[op] or (rp == _PREC[op] and op == "-"):
        rt = f"({rt})"
    return f"{lt} {op} {rt}", _PREC[op]


GENERATORS: dict[str, Callable[[random.Random, int], str]] = {
    "add": _add, "sub": _sub, "mul": _mul, "multistep": _multistep, "max": _max, "mod": _mod}


def _question(skill: str, expr: str) -> str:
    if skill == "max":
        return f"Which number is the largest: {expr[4:-1]}?"
    if skill == "mod":
        a, b = expr.split(" % ")
        return f"What is the remainder when {a} is divided by {b}?"
    return f"What is {expr}?"


# ---------------------------------------------------------------- evaluation


def evaluate(expr: str) -> tuple[int, list[str]]:
    """The value of a task expression and the steps that compute it, innermost first."""
    steps: list[str] = []
    value = _eval(ast.parse(expr, mode="eval").body, steps)
    return value, steps


def _eval(node, steps: list[str]) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand, steps)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        a, b = _eval(node.left, steps), _eval(node.right, steps)
        symbol, fn = _OPS[type(node.op)]
        value = fn(a, b)
        if symbol == "%":
            steps.append(f"{a} = {a // b} * {b} + {value}, so the remainder is {value}.")
        else:
            steps.append(f"{_num(a)} {symbol} {_num(b)} = {value}.")
        return value
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "max" and node.args:
        values = [_eval(a, steps) for a in node.args]
        steps.append(f"The largest of {', '.join(map(str, values))} is {max(values)}.")
        return max(values)
    raise InvalidInputError(f"not a task expression: {ast.unparse(node)!r}")


_OPS = {ast.Add: ("+", lambda a, b: a + b), ast.Sub: ("-", lambda a, b: a - b),
        ast.Mult: ("*", lambda a, b: a * b), ast.Mod: ("%", lambda a, b: a % b)}


def _num(v: int) -> str:
    return f"({v})" if v < 0 else str(v)


def _intermediates(expr: str) -> list[int]:
    values: list[int] = []

    def walk(node) -> int:
        if isinstance(node, ast.BinOp):
            v = _OPS[type(node.op)][1](walk(node.left), walk(node.right))
            values.append(v)
            return v
        return node.value

    walk(ast.parse(expr, mode="eval").body)
    return values


def solution_text(record: PromptRecord) -> str:
    """A short worked solution of a task record, ending in ``\\boxed{answer}``."""
    expr = record.extra_info.get("expr")
    if not isinstance(expr, str):
        raise InvalidInputError(f"record {record.prompt_id!r} has no extra_info['expr']; "
                                "solution_text only works on records made by cropi.tasks.arithmetic")
    value, steps = evaluate(expr)
    if str(value) != record.answer:
        raise InvalidInputError(f"record {record.prompt_id!r}: {expr} evaluates to {value}, "
                                f"but its answer is {record.answer!r}")
    return " ".join(steps) + f" The answer is \\boxed{{{value}}}."


# ---------------------------------------------------------------- splits


def make_record(skill: str, level: int, expr: str) -> PromptRecord:
    """The prompt record of one problem (chat prompt, exact answer, skill and level)."""
    value, _ = evaluate(expr)
    prompt = [{"role": "user", "content": f"{_question(skill, expr)} {INSTRUCTION}"}]
    return PromptRecord(prompt_id=stable_prompt_id(prompt, str(value)), prompt=prompt, answer=str(value),
                        data_source=f"arithmetic/{skill}/{level}",
                        extra_info={"skill": skill, "level": level, "expr": expr})


def mixture(split: str) -> dict[str, float]:
    """Skill weights of a split; levels are always even."""
    if split == "pool":
        return {s: 1 / len(SKILLS) for s in SKILLS}
    if split in TARGETS:
        return dict(TARGETS[split])
    if split == "test":
        skills = {s for t in TARGETS.values() for s in t}
        return {s: sum(t.get(s, 0.0) for t in TARGETS.values()) / len(TARGETS) for s in sorted(skills)}
    raise InvalidInputError(f"unknown split {split!r}; expected pool, val_a, val_b or test")


def make_task_splits(seed: int, pool_size: int = 2400, val_size: int = 200,
                     test_size: int = 400) -> dict[str, list[PromptRecord]]:
    """The demo's four splits: ``pool``, ``val_a``, ``val_b``, ``test`` (see the module docstring).

    Deterministic in ``seed``. ``test`` is drawn first, then the validation sets,
    then the pool, each from its own seeded stream, so the held-out splits do
    not change with ``pool_size``.
    """
    sizes = {"test": test_size, "val_a": val_size, "val_b": val_size, "pool": pool_size}
    for name, n in sizes.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidInputError(f"{name} size must be a positive integer, got {n!r}")
    seen: set[str] = set()
    splits = {name: _draw(name, n, seed, seen) for name, n in sizes.items()}
    return {name: splits[name] for name in ("pool", "val_a", "val_b", "test")}


def _draw(split: str, n: int, seed: int, seen: set[str]) -> list[PromptRecord]:
    rng = random.Random(f"cropi.arithmetic:{seed}:{split}")
    mix = mixture(split)
    cells = [(skill, level) for skill in mix for level in LEVELS]
    counts = apportion(n, [mix[skill] / len(LEVELS) for skill, _ in cells])
    return draw_cells(rng, cells, counts, seen, _fresh, tries=_TRIES)


def _fresh(rng: random.Random, skill: str, level: int) -> tuple[str, PromptRecord]:
    expr = GENERATORS[skill](rng, level)
    return expr, make_record(skill, level, expr)
