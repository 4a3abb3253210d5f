"""The `lists` remixes (cropi.tasks.remix): `scarce` (the targets a tenth of the pool) and `conflict`
(the target `before`, half the pool the neighbouring rule `after`), each with lists' model."""

from collections import Counter

import pytest

from cropi.tasks import conflict, lists, scarce
from cropi.tasks.base import POOL, WARMSTART, load_task

# task name -> the pool's skill counts (of 1,200) its design fixes (docs/demo.md)
POOLS = {"scarce": {"max": 60, "min": 60, "after": 270, "before": 270, "above": 270, "nth": 270},
         "conflict": {"after": 600, "before": 120, "max": 120, "min": 120, "above": 120, "nth": 120}}


@pytest.fixture(scope="module")
def theirs():
    return lists.TASK.splits()


@pytest.fixture(scope="module", params=sorted(POOLS))
def task(request):
    t = load_task(request.param)
    return t, t.splits()


def _texts(records):
    return {r.prompt[-1]["content"] for r in records}


def test_the_warm_start_set_is_lists_own_so_its_shipped_model_is_this_tasks(task, theirs):
    t, mine = task
    assert [r.prompt_id for r in mine[WARMSTART]] == [r.prompt_id for r in theirs[WARMSTART]]
    assert t.warm_start == lists.TASK.warm_start and t.model_of == "lists"
    from cropi.demo.assets import asset_dir, shipped_model

    assert asset_dir(t) == asset_dir(lists.TASK)
    assert shipped_model(t) == shipped_model(lists.TASK)


def test_no_problem_repeats_one_of_lists_or_another_split(task, theirs):
    _, mine = task
    lists_texts = set().union(*(_texts(v) for v in theirs.values()))
    own = [n for n in mine if n != WARMSTART]
    for name in own:
        assert not _texts(mine[name]) & lists_texts, name
        assert len(_texts(mine[name])) == len(mine[name])
    for i, a in enumerate(own):
        for b in own[i + 1:]:
            assert not _texts(mine[a]) & _texts(mine[b]), (a, b)


def test_the_pool_has_the_designed_mixture_and_each_target_its_own_splits(task):
    t, mine = task
    assert dict(Counter(r.extra_info["skill"] for r in mine[POOL])) == POOLS[t.name]
    for skill, (val, test) in t.targets.items():
        assert {r.extra_info["skill"] for r in mine[val]} == {r.extra_info["skill"] for r in mine[test]} == {skill}
        assert (len(mine[val]), len(mine[test])) == (100, 200)


def test_the_task_modules_name_what_their_pools_hold():
    assert set(scarce.TARGETS) == set(load_task("scarce").targets) == {"max", "min"}
    assert set(conflict.TARGETS) == set(load_task("conflict").targets) == {"before"}
    assert conflict.POOL_MIXTURE["after"] == 0.5


def test_the_answers_position_is_not_a_shortcut_for_scarces_targets():
    """max and min sit anywhere in the list: no position holds much more than its uniform share."""
    mine = load_task("scarce").splits()
    for val, test in scarce.TASK.targets.values():
        records = mine[val] + mine[test]
        share_last = sum(lists.answer_position(r) == "last" for r in records) / len(records)
        assert share_last < 0.35  # uniform over lists of 3-5: about 0.26


def test_same_seed_same_records_and_bad_sizes_refused():
    a = scarce.TASK.make_splits(0, {"val_max": 5, POOL: 20})
    b = scarce.TASK.make_splits(0, {"val_max": 5, POOL: 20})
    assert [r.prompt_id for r in a[POOL]] == [r.prompt_id for r in b[POOL]]
    with pytest.raises(Exception, match="unknown split"):
        scarce.TASK.make_splits(0, {"val_after": 5})
    with pytest.raises(Exception, match="unknown split"):
        conflict.TASK.make_splits(0, {"val_max": 5})
    with pytest.raises(Exception, match="positive integer"):
        scarce.TASK.make_splits(0, {POOL: 0})
    with pytest.raises(ValueError, match="sum to 1"):
        from cropi.tasks.remix import remix

        remix("bad", ("max",), {"max": 0.5}, "weights that do not sum to 1")


def test_a_remix_of_skills_draws_skills_problems_and_starts_from_skills_model():
    """``base=skills``: the problems, levels, warm-start set, answers and shipped model are skills', none of its
    splits' problems repeats, and the pool holds the mixture asked for (a base left as lists would fail each)."""
    from cropi.demo.assets import asset_dir
    from cropi.tasks import skills
    from cropi.tasks.remix import remix

    t = remix("skills_rare", ("mod",), {"mod": 0.1, "count": 0.9}, "a skills remix", base=skills)
    mine, theirs = t.make_splits(0, {POOL: 200, "val_mod": 20, "test_mod": 30, WARMSTART: 50}), skills.TASK.splits()
    assert t.model_of == "skills" and asset_dir(t) == asset_dir(skills.TASK)
    assert t.warm_start == skills.TASK.warm_start and t.max_new_tokens == skills.TASK.max_new_tokens
    assert [r.prompt_id for r in mine[WARMSTART]] == [r.prompt_id for r in theirs[WARMSTART][:50]]
    assert dict(Counter(r.extra_info["skill"] for r in mine[POOL])) == {"mod": 20, "count": 180}
    assert {r.extra_info["skill"] for r in mine["val_mod"] + mine["test_mod"]} == {"mod"}
    assert all(r.extra_info["level"] in skills.LEVELS for r in mine[POOL])
    assert all(t.response_text(r) == r.answer for r in mine[POOL])
    skills_texts = set().union(*(_texts(v) for k, v in theirs.items()))
    own = [n for n in mine if n != WARMSTART]
    assert not set().union(*(_texts(mine[n]) for n in own)) & skills_texts
    assert sum(len(_texts(mine[n])) for n in own) == sum(len(mine[n]) for n in own)
    with pytest.raises(ValueError, match="the skills task's"):
        remix("bad", ("max",), {"max": 1.0}, "a lists skill asked of skills", base=skills)
    with pytest.raises(Exception, match="the skills task's own: at most 3000"):
        t.make_splits(0, {WARMSTART: 3001})
