"""The `scarce` task: lists' problems with the targets' skills a tenth of the pool, and lists' model."""

from collections import Counter

import pytest

from cropi.tasks import lists, scarce
from cropi.tasks.base import POOL, WARMSTART, load_task


@pytest.fixture(scope="module")
def drawn():
    return load_task("scarce").splits(), lists.TASK.splits()


def _texts(records):
    return {r.prompt[-1]["content"] for r in records}


def test_the_warm_start_set_is_lists_own_so_its_shipped_model_is_this_tasks(drawn):
    mine, theirs = drawn
    assert [r.prompt_id for r in mine[WARMSTART]] == [r.prompt_id for r in theirs[WARMSTART]]
    assert scarce.TASK.warm_start == lists.TASK.warm_start
    from cropi.demo.assets import asset_dir, shipped_model

    assert asset_dir(scarce.TASK) == asset_dir(lists.TASK)
    assert shipped_model(scarce.TASK) == shipped_model(lists.TASK)


def test_no_problem_repeats_one_of_lists_or_another_split(drawn):
    mine, theirs = drawn
    lists_texts = set().union(*(_texts(v) for v in theirs.values()))
    own = [n for n in mine if n != WARMSTART]
    for name in own:
        assert not _texts(mine[name]) & lists_texts, name
        assert len(_texts(mine[name])) == len(mine[name])
    for i, a in enumerate(own):
        for b in own[i + 1:]:
            assert not _texts(mine[a]) & _texts(mine[b]), (a, b)


def test_the_targets_are_scarce_in_the_pool_and_alone_in_their_splits(drawn):
    mine, _ = drawn
    counts = Counter(r.extra_info["skill"] for r in mine[POOL])
    assert counts["max"] == counts["min"] == round(scarce.TARGET_SHARE * len(mine[POOL]))
    others = [counts[s] for s in lists.SKILLS if s not in scarce.TARGETS]
    assert len(others) == 4 and max(others) - min(others) <= 1 and sum(counts.values()) == len(mine[POOL])
    for skill, (val, test) in scarce.TARGETS.items():
        assert {r.extra_info["skill"] for r in mine[val] + mine[test]} == {skill}


def test_the_answers_position_is_not_a_shortcut_for_the_targets(drawn):
    """max and min sit anywhere in the list: no position holds much more than its uniform share."""
    mine, _ = drawn
    for val, test in scarce.TARGETS.values():
        records = mine[val] + mine[test]
        share_last = sum(lists.answer_position(r) == "last" for r in records) / len(records)
        assert share_last < 0.35  # uniform over lists of 3-5: about 0.26


def test_same_seed_same_records_and_bad_sizes_refused():
    a = scarce.make_splits(0, {"val_max": 5, POOL: 20})
    b = scarce.make_splits(0, {"val_max": 5, POOL: 20})
    assert [r.prompt_id for r in a[POOL]] == [r.prompt_id for r in b[POOL]]
    with pytest.raises(Exception, match="unknown split"):
        scarce.make_splits(0, {"val_after": 5})
    with pytest.raises(Exception, match="positive integer"):
        scarce.make_splits(0, {POOL: 0})
