"""The synthetic arithmetic task: determinism, disjoint splits, skill mixtures, correct answers."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections import Counter

import pytest

from cropi.data import PromptRecord, load_prompts, stable_prompt_id, write_verl_parquet
from cropi.errors import InvalidInputError
from cropi.rewards import get_reward
from cropi.tasks import LEVELS, SKILLS, TARGETS, make_task_splits, mixture, solution_text
from cropi.tasks.arithmetic import MAX_INTERMEDIATE
from cropi.tasks.sampling import apportion

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = dict(pool_size=360, val_size=60, test_size=120)


@pytest.fixture(scope="module")
def splits():
    return make_task_splits(7)


@pytest.fixture(scope="module")
def small():
    return make_task_splits(11, **SMALL)


def _all(splits):
    return [r for rs in splits.values() for r in rs]


def _brute(expr: str) -> int:
    """Python's own evaluator, on the node types the task may use and nothing else."""
    allowed = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Add, ast.Sub, ast.Mult, ast.Mod,
               ast.USub, ast.Call, ast.Name, ast.Load)
    tree = ast.parse(expr, mode="eval")
    assert all(isinstance(n, allowed) for n in ast.walk(tree)), expr
    return eval(compile(tree, "<task>", "eval"), {"__builtins__": {}}, {"max": max})


def test_sizes_keys_and_determinism(splits):
    assert list(splits) == ["pool", "val_a", "val_b", "test"]
    assert [len(v) for v in splits.values()] == [2400, 200, 200, 400]
    again = make_task_splits(7)
    assert again == splits
    other = make_task_splits(8)
    assert {r.prompt_id for r in _all(other)} != {r.prompt_id for r in _all(splits)}


def test_same_splits_in_another_process(small):
    code = ("from cropi.tasks import make_task_splits; s = make_task_splits(11, pool_size=360, val_size=60, "
            "test_size=120); print({k: [r.prompt_id for r in v] for k, v in s.items()})")
    env = {**os.environ, "PYTHONHASHSEED": "123", "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == str({k: [r.prompt_id for r in v] for k, v in small.items()})


def test_no_problem_repeats_within_or_across_splits(splits):
    records = _all(splits)
    for key in (lambda r: r.prompt_id, lambda r: r.extra_info["expr"], lambda r: r.prompt[0]["content"]):
        counts = Counter(key(r) for r in records)
        assert max(counts.values()) == 1


def test_held_out_splits_do_not_depend_on_pool_size(splits):
    bigger = make_task_splits(7, pool_size=3000)
    for name in ("val_a", "val_b", "test"):
        assert bigger[name] == splits[name]
    assert len(bigger["pool"]) == 3000


def _skill_counts(records):
    return Counter(r.extra_info["skill"] for r in records)


def test_targeted_splits_concentrate_on_their_skills(splits):
    for name, weights in TARGETS.items():
        counts = _skill_counts(splits[name])
        assert set(counts) == set(weights)
        for skill, w in weights.items():
            assert abs(counts[skill] - w * len(splits[name])) <= len(LEVELS)
    assert not set(TARGETS["val_a"]) & set(TARGETS["val_b"])  # two different targets


def test_test_split_is_the_mixture_of_both_validation_sets(splits):
    test = _skill_counts(splits["test"])
    union = _skill_counts(splits["val_a"]) + _skill_counts(splits["val_b"])
    n_test, n_union = len(splits["test"]), len(splits["val_a"]) + len(splits["val_b"])
    assert set(test) == set(union)
    for skill in union:
        assert abs(test[skill] / n_test - union[skill] / n_union) <= 2 * len(LEVELS) / n_test
    assert mixture("test") == pytest.approx({s: sum(t.get(s, 0) for t in TARGETS.values()) / 2
                                             for s in union})


def test_pool_spreads_evenly_over_every_skill_and_level(splits):
    cells = Counter((r.extra_info["skill"], r.extra_info["level"]) for r in splits["pool"])
    assert set(cells) == {(s, lv) for s in SKILLS for lv in LEVELS}
    even = len(splits["pool"]) / len(cells)
    assert all(abs(c - even) <= 1 for c in cells.values())


def test_records_are_well_formed_and_answers_are_right(splits):
    for r in _all(splits):
        skill, level, expr = r.extra_info["skill"], r.extra_info["level"], r.extra_info["expr"]
        assert r.answer == str(_brute(expr))
        assert r.data_source == f"arithmetic/{skill}/{level}"
        assert r.prompt_id == stable_prompt_id(r.prompt, r.answer)
        [msg] = r.prompt
        assert msg["role"] == "user" and "\\boxed{}" in msg["content"]
        numbers = re.findall(r"-?\d+", expr.replace("max", ""))
        assert all(n in msg["content"] for n in numbers)  # the question states every operand


def test_levels_set_the_difficulty(splits):
    def digits(n):
        return len(str(abs(int(n))))

    for r in splits["pool"]:
        skill, level, expr = r.extra_info["skill"], r.extra_info["level"], r.extra_info["expr"]
        nums = re.findall(r"-?\d+", expr)
        if skill in ("add", "sub"):
            assert [digits(n) for n in nums] == [level + 1] * 2
        elif skill == "mul":
            assert [digits(n) for n in nums] == [level, 2]
        elif skill == "mod":
            assert digits(nums[0]) == level + 1 and digits(nums[1]) == (1 if level == 1 else 2)
        elif skill == "max":
            assert len(nums) == level + 2 and all(digits(n) == level + 1 for n in nums)
        else:
            assert len(nums) == level + 2 and all(1 <= int(n) <= 12 for n in nums)


def test_multistep_uses_parentheses_and_stays_small(splits):
    multi = [r.extra_info["expr"] for r in _all(splits) if r.extra_info["skill"] == "multistep"]
    assert sum("(" in e for e in multi) > len(multi) / 4
    for e in multi:
        values = [_brute(ast.unparse(n)) for n in ast.walk(ast.parse(e, mode="eval")) if isinstance(n, ast.BinOp)]
        assert all(abs(v) <= MAX_INTERMEDIATE for v in values), e


def test_every_worked_solution_earns_the_math_verify_reward(small):
    reward = get_reward("math_verify")
    for r in _all(small):
        text = solution_text(r)
        assert text.endswith(f"\\boxed{{{r.answer}}}.")
        assert reward(text, r.answer) == 1.0, (r.extra_info, text)


def test_solution_text_refuses_foreign_or_inconsistent_records(small):
    r = small["val_a"][0]
    with pytest.raises(InvalidInputError, match="expr"):
        solution_text(PromptRecord(prompt_id="x", prompt="q", answer="1"))
    with pytest.raises(InvalidInputError, match="evaluates to"):
        solution_text(r.model_copy(update={"answer": str(int(r.answer) + 1)}))


def test_task_records_survive_the_verl_round_trip(small, tmp_path):
    path = str(tmp_path / "val_b.parquet")
    write_verl_parquet(small["val_b"], path, split="val_b")
    assert load_prompts(path) == small["val_b"]


@pytest.mark.parametrize("kwargs", [dict(pool_size=0), dict(val_size=-1), dict(test_size=2.5),
                                    dict(pool_size=True)])
def test_bad_sizes_are_refused(kwargs):
    with pytest.raises(InvalidInputError, match="size"):
        make_task_splits(0, **kwargs)


def test_apportion_is_exact_and_proportional():
    for n, weights in ((2400, [1] * 18), (7, [0.25, 0.25, 0.5]), (200, [0.75 / 3] * 3 + [0.25 / 3] * 3), (1, [1, 1])):
        counts = apportion(n, weights)
        assert sum(counts) == n
        total = sum(weights)
        assert all(abs(c - n * w / total) < 1 for c, w in zip(counts, weights))
