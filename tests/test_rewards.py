"""Rewards: the registry, math_verify the way verl uses it, exact_numeric, failure-proof scoring."""

from __future__ import annotations

import logging
import random
import signal
import threading
import time
from fractions import Fraction

import pytest

from cropi.errors import InvalidInputError
from cropi.rewards import (NonNumericAnswerError, RewardTimeoutError, UnknownRewardError, available_rewards,
                           call_with_deadline, get_reward, register_reward, score_responses)
from cropi.rewards.registry import _REWARDS
from cropi.rewards.verl_reward import compute_score


def _run_in_thread(fn, *args):
    box = {}

    def run():
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            box["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join(30)
    if "error" in box:
        raise box["error"]
    return box["value"]


# ---------------------------------------------------------------- registry


def test_builtins_are_registered_and_unknown_names_list_them():
    assert {"math_verify", "exact_numeric"} <= set(available_rewards())
    assert available_rewards() == sorted(available_rewards())
    with pytest.raises(UnknownRewardError) as e:
        get_reward("nope")
    assert isinstance(e.value, InvalidInputError)
    assert "nope" in str(e.value) and all(n in str(e.value) for n in available_rewards())


def test_register_custom_reward_and_refuse_a_taken_name():
    try:
        @register_reward("test_contains")
        def contains(response_text, answer):
            return float(answer in response_text)

        assert get_reward("test_contains") is contains
        assert "test_contains" in available_rewards()
        register_reward("test_contains")(contains)  # the same function again is harmless
        with pytest.raises(InvalidInputError, match="already registered"):
            register_reward("test_contains")(lambda r, a: 0.0)
        other = register_reward("test_contains", replace=True)(lambda r, a: 0.5)
        assert get_reward("test_contains") is other
        with pytest.raises(InvalidInputError):
            register_reward("")
    finally:
        _REWARDS.pop("test_contains", None)


# ---------------------------------------------------------------- math_verify


EQUIVALENT = [
    ("So the answer is \\boxed{1/2}.", "0.5"),
    ("\\boxed{0.5}", "1/2"),
    ("The final answer is $\\frac{1}{2}$", "0.5"),
    ("\\boxed{\\frac{3}{4}}", "0.75"),
    ("We get \\boxed{1,234}", "1234"),
    ("\\boxed{-21}", "-21"),
    ("x = 2, so \\boxed{2}", "2"),
    ("\\boxed{\\sqrt{4}}", "2"),
    ("\\boxed{2\\pi}", "2\\pi"),
]
WRONG = [
    ("\\boxed{-21}", "21"),
    ("\\boxed{1/3}", "0.5"),
    ("The answer is 7.", "8"),
    ("I don't know.", "3"),
    ("", "3"),
    ("\\boxed{}", "3"),
]


def _verl_way(response, answer):
    """verl's reward_score/math_verify.py recipe, straight on the math_verify library."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    gold = parse("\\boxed{" + answer + "}", [LatexExtractionConfig()])
    pred = parse(response, [ExprExtractionConfig(), LatexExtractionConfig()])
    return 1.0 if verify(gold, pred) else 0.0


@pytest.mark.parametrize("response,answer", EQUIVALENT)
def test_math_verify_accepts_equivalent_forms(response, answer):
    f = get_reward("math_verify")
    assert f(response, answer) == 1.0
    assert f(response, answer) == _verl_way(response, answer)


@pytest.mark.parametrize("response,answer", WRONG)
def test_math_verify_rejects_wrong_answers(response, answer):
    f = get_reward("math_verify")
    assert f(response, answer) == 0.0
    assert f(response, answer) == _verl_way(response, answer)


def test_math_verify_gold_already_boxed_or_in_dollars_is_not_wrapped_again():
    f = get_reward("math_verify")
    assert f("\\boxed{5}", "\\boxed{5}") == 1.0
    assert f("\\boxed{5}", "$5$") == 1.0
    assert f("\\boxed{6}", "$5$") == 0.0


def test_math_verify_works_off_the_main_thread():
    f = get_reward("math_verify")
    cases = EQUIVALENT[:4] + WRONG[:3]
    assert _run_in_thread(lambda: [f(r, a) for r, a in cases]) == [f(r, a) for r, a in cases]
    assert _run_in_thread(score_responses, f, ["\\boxed{2}", "\\boxed{3}"], "2") == [1.0, 0.0]


def test_math_verify_timeout_becomes_none(monkeypatch, caplog):
    import math_verify
    from math_verify.errors import TimeoutException

    def stuck(*a, **k):
        raise TimeoutException("simulated")

    monkeypatch.setattr(math_verify, "parse", stuck)
    f = get_reward("math_verify")
    with pytest.raises(RewardTimeoutError):
        f("\\boxed{1}", "uncached gold 1")
    with caplog.at_level(logging.WARNING):
        assert score_responses(f, ["\\boxed{1}"], "uncached gold 2") == [None]
    assert "RewardTimeoutError" in caplog.text


def test_math_verify_unparseable_gold_raises_and_scores_none():
    f = get_reward("math_verify")
    with pytest.raises(InvalidInputError, match="ground truth"):
        f("\\boxed{1}", "}")
    assert score_responses(f, ["\\boxed{1}", "1"], "}") == [None, None]


# ---------------------------------------------------------------- exact_numeric


def _render(v: Fraction, rng: random.Random) -> list[str]:
    """Ways a response can state the value ``v``."""
    out = []
    if v.denominator == 1:
        n = int(v)
        out += [f"So it is {n}.", f"\\boxed{{{n}}}", f"Steps 3 + 4 = 7, then \\boxed{{{n}}} is it"]
        if abs(n) >= 1000:
            out.append(f"The answer is {n:,}.")
    else:
        out += [f"\\boxed{{\\frac{{{v.numerator}}}{{{v.denominator}}}}}", f"answer: {v.numerator}/{v.denominator}",
                f"about {float(v):.9f}"]
    return out


def test_exact_numeric_against_brute_force():
    f = get_reward("exact_numeric")
    rng = random.Random(0)
    for _ in range(150):
        gold = Fraction(rng.randint(-20000, 20000), rng.choice([1, 1, 1, 2, 3, 4, 7]))
        other = gold + Fraction(rng.randint(1, 50), rng.choice([1, 2, 5]))
        for text in _render(gold, rng):
            assert f(text, str(gold)) == 1.0, (text, gold)
            assert f(text, str(other)) == 0.0, (text, other)


@pytest.mark.parametrize("response,answer,want", [
    ("\\boxed{12} but maybe 13", "12", 1.0),       # the boxed value wins over a later number
    ("first 12, finally 13", "13", 1.0),           # else the last number
    ("5-3=2", "2", 1.0),                           # a minus after a digit is subtraction
    ("x = 10-3", "7", 0.0),                        # no arithmetic is done on the text
    ("it is -7", "-7", 1.0),
    ("\\boxed{x = 1,234}", "1234", 1.0),
    ("0.3333333", "1/3", 1.0),                     # within 1e-6
    ("0.333", "1/3", 0.0),
    ("1000000.5", "1000000", 1.0),                 # relative tolerance 1e-6
    ("1000002", "1000000", 0.0),
    ("\\boxed{2.50}", "5/2", 1.0),
    ("no numbers", "1", 0.0),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0),
])
def test_exact_numeric_cases(response, answer, want):
    assert get_reward("exact_numeric")(response, answer) == want


def test_exact_numeric_refuses_a_non_numeric_answer():
    f = get_reward("exact_numeric")
    with pytest.raises(NonNumericAnswerError):
        f("\\boxed{x}", "x+1")
    assert score_responses(f, ["1"], "x+1") == [None]


# ---------------------------------------------------------------- scoring and deadlines


def test_score_responses_marks_failures_none_and_keeps_the_rest(caplog):
    def picky(response_text, answer):
        if response_text == "boom":
            raise RuntimeError("kaput")
        if response_text == "nan":
            return float("nan")
        if response_text == "text":
            return "yes"
        return response_text == answer

    with caplog.at_level(logging.WARNING):
        got = score_responses(picky, ["1", "boom", "2", "nan", "text"], "1")
    assert got == [1.0, None, 0.0, None, None]
    assert "response 1" in caplog.text and "kaput" in caplog.text and "response 3" in caplog.text


def test_a_text_drawn_more_than_once_is_scored_once_and_every_copy_gets_its_score(caplog):
    calls = []

    def counted(response_text, answer):
        calls.append(response_text)
        if response_text == "boom":
            raise RuntimeError("kaput")
        return float(response_text == answer)

    with caplog.at_level(logging.WARNING):
        got = score_responses(counted, ["7", "8", "7", "boom", "7", "boom", "8"], "7")
    assert got == [1.0, 0.0, 1.0, None, 1.0, None, 0.0]
    assert calls == ["7", "8", "boom"]  # each distinct text once, in the order drawn
    assert caplog.text.count("kaput") == 1 and "response 3" in caplog.text
    assert score_responses(counted, [], "7") == []


def _sleepy(response_text, answer):
    time.sleep(float(response_text))
    return 1.0


@pytest.mark.parametrize("where", ["main", "thread"])
def test_slow_reward_times_out_to_none(where):
    call = (lambda *a, **k: score_responses(*a, **k)) if where == "main" else \
        (lambda *a, **k: _run_in_thread(lambda: score_responses(*a, **k)))
    start = time.monotonic()
    assert call(_sleepy, ["0", "3", "0"], "x", timeout_s=0.3) == [1.0, None, 1.0]
    assert time.monotonic() - start < 2.0
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_deadline_restores_the_signal_handler_and_a_pending_alarm():
    seen = []
    old = signal.signal(signal.SIGALRM, lambda s, f: seen.append(s))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        assert call_with_deadline(lambda: 3, (), 0.2) == 3
        with pytest.raises(RewardTimeoutError):
            call_with_deadline(time.sleep, (1.0,), 0.05)
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0 < left < 0.5  # the outer alarm is still pending, less the time spent
        time.sleep(left + 0.1)
        assert seen == [signal.SIGALRM]  # and it went to the outer handler
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_math_verify_under_a_deadline_leaves_no_alarm_behind():
    f = get_reward("math_verify")
    handler = signal.getsignal(signal.SIGALRM)
    assert score_responses(f, [r for r, _ in EQUIVALENT[:3]], "0.5", timeout_s=5) == [1.0, 1.0, 1.0]
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) is handler


def test_verl_compute_score_signature_and_failures():
    assert compute_score("arithmetic/mul/1", "so \\boxed{12}", "12") == 1.0
    assert compute_score("arithmetic/mul/1", "so \\boxed{13}", "12", extra_info={"index": 0}) == 0.0
    assert compute_score("x", "7", "7", extra_info={"reward": "exact_numeric"}) == 1.0
    assert compute_score("x", "7", "not a number", extra_info={"reward": "exact_numeric"}) == 0.0


def test_math_verify_inside_a_deadline_does_not_cancel_it():
    # math-verify's own alarms share ITIMER_REAL with the deadline; they must stay off under one
    def verify_then_hang(response_text, answer):
        get_reward("math_verify")(response_text, answer)
        time.sleep(3)
        return 1.0

    start = time.monotonic()
    assert score_responses(verify_then_hang, ["\\boxed{1}"], "1", timeout_s=0.5) == [None]
    assert time.monotonic() - start < 2.0
