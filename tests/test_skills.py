"""The demo's skills task: answers right, splits disjoint and balanced, the oracle's selection exact."""

from __future__ import annotations

from collections import Counter

import pytest

from cropi.errors import InvalidInputError
from cropi.selection import SelectionInputs, select


def select_oracle(pool, validation):
    return select("oracle", SelectionInputs(list(pool), 0.1, records=pool, validation=validation)).chosen
from cropi.tasks.sampling import TaskSizeError
from cropi.tasks.skills import LEVELS, SKILLS, TARGETS, make_splits, mixture

SIZES = {"test_count": 30, "test_maxd": 30, "val_count": 12, "val_maxd": 12, "pool": 180, "warmstart": 90}
ORDINALS = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth"]


@pytest.fixture(scope="module")
def splits():
    return make_splits(3, SIZES)


def independent_answer(skill: str, question: str) -> int:
    """The answer worked out from the question text alone, without the generator."""
    words = question.rstrip("?").split()
    if skill == "mod":  # What is X mod D
        return int(words[2]) % int(words[4])
    if skill == "lastmul":  # Last digit of X * D
        return int(str(int(words[3]) * int(words[5]))[-1])
    if skill == "count":  # How many Ds in N
        return words[4].count(words[2][0])
    if skill == "pos":  # The K digit of N
        return int(words[4][ORDINALS.index(words[1])])
    if skill == "maxd":
        return int(sorted(words[-1])[-1])
    if skill == "mind":
        return int(sorted(words[-1])[0])
    raise AssertionError(skill)


def test_every_answer_is_right(splits):
    for records in splits.values():
        for r in records:
            assert int(r.answer) == independent_answer(r.extra_info["skill"], r.prompt[0]["content"]), r


def test_no_problem_in_two_splits_and_ids_unique(splits):
    seen = Counter(r.prompt[0]["content"] for records in splits.values() for r in records)
    assert max(seen.values()) == 1
    ids = [r.prompt_id for records in splits.values() for r in records]
    assert len(ids) == len(set(ids))


def test_split_mixtures(splits):
    pool = Counter((r.extra_info["skill"], r.extra_info["level"]) for r in splits["pool"])
    assert set(pool) == {(s, lv) for s in SKILLS for lv in LEVELS}
    assert set(pool.values()) == {180 // 18}  # even over every skill and level
    for skill, (val, test) in TARGETS.items():
        for name in (val, test):
            assert {r.extra_info["skill"] for r in splits[name]} == {skill}
            assert {r.data_source for r in splits[name]} == {f"skills/{skill}"}


def test_test_splits_do_not_depend_on_the_pool_size():
    a = make_splits(3, SIZES)
    b = make_splits(3, SIZES | {"pool": 360})
    for name in ("test_count", "test_maxd", "val_count", "val_maxd"):
        assert [r.prompt_id for r in a[name]] == [r.prompt_id for r in b[name]]
    assert make_splits(3, SIZES)["pool"] == a["pool"]  # deterministic
    assert make_splits(4, SIZES)["pool"] != a["pool"]


def test_bad_sizes_are_refused():
    with pytest.raises(InvalidInputError, match="unknown split"):
        make_splits(0, {"train": 10})
    with pytest.raises(InvalidInputError, match="positive integer"):
        make_splits(0, {"pool": 0})
    with pytest.raises(TaskSizeError, match="distinct"):
        make_splits(0, {"pool": 30_000})  # level-1 mod holds 360 problems
    assert mixture("pool") == {s: 1 / 6 for s in SKILLS}


def test_oracle_selects_exactly_the_targeted_skills(splits):
    pool = {r.prompt_id: r for r in splits["pool"]}
    chosen = select_oracle(pool, splits["val_count"] + splits["val_maxd"])
    expected = [p for p, r in pool.items() if r.extra_info["skill"] in TARGETS]
    assert chosen == expected and len(chosen) == 60
    with pytest.raises(InvalidInputError, match="data_source"):
        select_oracle({p: r for p, r in pool.items() if r.extra_info["skill"] == "pos"}, splits["val_count"])
