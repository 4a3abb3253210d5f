"""The stage check: what a stage's subset does to the validation objective, and what to do about it.

A checked stage is trained in parts (cropi.pipeline.curriculum.parts runs them); after each part this
module measures the *validation objective* (the mean over the targeted validation sets of the mean
pass rate of a fixed sample of their prompts, ``samples`` draws a prompt at the trainer's
temperature) and decides, from the measured noise alone:

- ``reverted``: the objective fell below the stage's best by more than ``t * SE`` (``paired_change``:
  the same prompts and random streams at both checkpoints, the SE from the per-prompt changes' unbiased
  variance), ``t`` Student's one-sided quantile at ``alpha`` Bonferroni-split over the stage's checks, at the
  SE's Welch-Satterthwaite degrees of freedom (revision 7: the SE is estimated from the prompts read, and
  the normal quantile erred above the stated rate, most at the small plans of low-variance sets), *and* a fresh
  reading of both checkpoints confirms it (``confirmed``): on another random stream and on validation
  prompts the check never read (``ValidationSample.draw_pair``). The best is chosen by its readings, so
  they are biased upward (the winner's curse: 24 false reversals on `skills` in issue 32's first round);
  a fresh stream alone left the bias of the prompts it was chosen on (round 2: 17 of 20 confirmed
  reversals against a stage start chosen on the same prompts). Neither was chosen on the fresh pair, so
  its test errs at the stated rate. A screen the fresh pair does not confirm is ``unconfirmed`` and the
  part is kept. At the whole pool a reversal has no other subset to go on with, only the best
  checkpoint; ``at_whole_pool: keep`` records the screen as ``no_fallback`` and keeps the part instead
  (``without_fallback``; it measured lower, so the default reverts). Fraction 1 is the whole pool for both
  arms because a widened subset is filled to its share of the pool (``widened: filled``, revision 11): a
  ranking selector's own pick stops at its candidates (at fraction 1 on `skills`, 366-767 of 1,200
  prompts). The best is the curriculum's so far (``best_of: run``): a stage starts with the previous
  stage's best where it reads above the stage's start, so falls each inside one stage's margin cannot add
  up over the stages;
- ``widened`` (the fraction doubles, the subset filled up to that share of the pool: ``filled``): the part's
  share of all-equal reward groups (zero gradient) exceeds the pool's expected
  share (``flat_share``) by more than ``z_{1-alpha}`` binomial standard errors and (``widen_when: stalled``,
  revision 16) the part's rise over the best is not resolved at alpha, since a subset that still moves the
  targets is working however few nonzero gradients it gives a step; or both arms have now
  fallen (confirmed) from the same checkpoint, which is evidence against the fraction, not against one arm
  (parts.py);
  with ``widen_check: race`` a saturation does not widen at once: the next part races the current subset against
  the doubled one from the same checkpoint and the higher reading goes on (parts.py), since whether a wider subset
  moves the targets more is its effect, which no saturation test measures;
- ``kept`` otherwise. The sample size follows from the noise it must resolve (``sample_size``): with ``sizing:
  stage_start`` (revision 12) the per-prompt variance at the checkpoint the stage starts from (the previous
  checked stage's end reading; theta_0's offline trajectories at stage 0), at least ``resolve (1 - resolve)``.

Only validation sets are read, never test splits. docs/demo.md states the design and why.
"""

from __future__ import annotations

import hashlib
import math
import random
import time
from dataclasses import dataclass
from statistics import NormalDist
from typing import Literal, Mapping, Optional, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from cropi.pipeline.rank import SelectorName
from cropi.selection import FALLBACK_SELECTOR

_NORMAL = NormalDist()
MAX_SAMPLES = 64  # draws per validation prompt at a check, at most (CheckOptions.samples, fit_samples)


class CheckOptions(BaseModel):
    """How a curriculum stage checks its own effect (on by default)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(True, description="train each stage in parts and check the validation objective after each")
    parts: int = Field(4, ge=1, le=64, description="checks a stage (its steps split evenly; at most one per step)")
    samples: int = Field(4, ge=1, le=MAX_SAMPLES, description="draws per validation prompt at a check (raised, up to "
                         f"{MAX_SAMPLES}, for a validation set too small for the prompts the check needs at it)")
    alpha: float = Field(0.05, gt=0, lt=0.5, description="chance per stage of a fallback when nothing changed")
    power: float = Field(0.8, gt=0.5, lt=1, description="chance of detecting a fall of `resolve`")
    resolve: float = Field(0.1, gt=0, le=1, description="the fall of the validation pass rate the check must "
                                                        "detect: sizes its prompt sample")
    fallback: SelectorName = Field(FALLBACK_SELECTOR, description="the second arm: the selector a stage falls back to")
    race: bool = Field(True, description="stage 0's first part trains both arms and keeps the better (off: no "
                                         "race at any stage, rerace included)")
    race_length: Literal["sequential", "part", "half"] = Field(
        "sequential", description="how long each arm of the arms' race trains: half of the stage's first part, and, "
                                  "only where the higher half's lead is not resolved at alpha, the other half on "
                                  "from each arm's own checkpoint, the higher of the whole parts going on (sequential: "
                                  "issue 32's revision 19, docs/demo.md round 19); the whole first part (part: "
                                  "revisions 8-16, the loser's part spent beside the winner's); or half of it, the "
                                  "winner going on from its own checkpoint and the two halves together taking one "
                                  "part of the stage's steps (half: the round 15 and 18 candidate)")
    race_unresolved: Literal["higher", "fallback"] = Field(
        "higher", description="which arm goes on where the race's last look leaves the higher reading's lead over "
                              "the other unresolved at alpha: the higher reading (higher: revisions 8-19), or the "
                              "fallback, the arm of the smaller downside, where the race cannot tell its arms apart "
                              "(fallback: the round 20 candidate, docs/demo.md)")
    race_sample: Literal["rest", "check"] = Field(
        "rest", description="what a race's arms are read on: every validation prompt not held out to confirm a "
                            "fall, at the most draws a prompt whose generations stay within what the race's second "
                            "half trains one arm on, at least the check's (rest: issue 32's revision 22, docs/demo.md "
                            "rounds 21-22; a race's leads are a fifth to a half of a fall, and on the check's sample "
                            "its first looks were mostly unresolved), or the check's sample, sized for a fall of "
                            "resolve (check: revisions 8-19)")
    race_no_gain: Literal["restart", "higher", "pool", "keep"] = Field(
        "restart", description="where a race's winner shows no gain over the stage's start on the race's own sample "
                               "(the start read there too, paired prompt by prompt; race_gain says what counts): go "
                               "on at the whole pool (no_gain_draw says which of its prompts), since neither ranked "
                               "subset showed a gain at this fraction, from the check's best checkpoint (the stage's "
                               "start, or the curriculum's best where that read higher), over which the race's own "
                               "reading showed the winner no gain, the winner not made the best (restart: issue 32's "
                               "revision 24, docs/demo.md round 24); the same from the winner's checkpoint where "
                               "the race read it above the start, inside the noise, judged as any kept part, and "
                               "from the best where it read at or below (higher: round 28's candidate, not "
                               "adopted: which checkpoint goes on is the point estimate's argmax, as the check's best "
                               "is, since the race's steps are spent either way); the same from the winner's "
                               "checkpoint (or the best a confirmed fall restores) (pool: revision 23); or with the "
                               "winner's subset as any winner does (keep: revisions 8-22); needs race_sample: rest")
    race_gain: Literal["resolved", "any"] = Field(
        "resolved", description="what counts as a race's gain over the stage's start under race_no_gain (restart "
                                "or pool): only a lead of the winner's reading over the start's resolved one-sided "
                                "at alpha by the race's own test, since a gain inside the noise shows no more than "
                                "none does (resolved: issue 32's revision 25, docs/demo.md round 25), or any lead "
                                "above zero (any: revisions 23-24)")
    race_futility: Literal["stop", "never"] = Field(
        "stop", description="a sequential race's first look where the arms' lead is not resolved: the stage's start "
                            "read there on the race's own sample, and where the higher arm's paired gain over it is "
                            "at or below zero the race stops, the higher first half winning as in a half-part race, "
                            "since under the first half's trend the whole part resolves a gain with probability under "
                            "1 - Phi(sqrt(2) t), and without a resolved gain both arms' steps are discarded (stop: "
                            "issue 32's revision 27, docs/demo.md round 29: a futility bound at half the "
                            "information); or every unresolved first look goes on (never: revisions 19-26); acts "
                            "only where race_no_gain is not keep")
    race_efficacy: Literal["stop", "never"] = Field(
        "never", description="a sequential race's first look where the arms' lead is not resolved and the futility "
                             "bound (race_futility) did not stop it: where the higher arm's paired gain over the "
                             "stage's start, read there on the race's own sample, is resolved at alpha by the race's "
                             "test, the race stops, the higher first half winning as in a half-part race, since the "
                             "no-gain test that follows reads that resolved gain and can no longer send the stage to "
                             "the no-gain draw: the second half could change only which of two arms the first look "
                             "could not tell apart goes on, at the cost of the loser's other half (stop: the round 31 "
                             "candidate, not adopted, docs/demo.md: where the whole part would have picked the other "
                             "arm, 5 of 26 races, the half's pick lost 0.030 a run, and D was -0.0007 over 31 tasks); "
                             "or such a look goes on (never: revisions 19-27); acts only where race_no_gain is not "
                             "keep and race_gain is resolved")
    race_gain_length: Literal["half", "sequential"] = Field(
        "half", description="a sequential race decided at its first look (the arms' lead resolved): the winner's "
                            "gain over the stage's start read at its half only, the no-gain action taking the pool "
                            "where it is not resolved (half: revisions 19-27); or read as the race reads its arms, a "
                            "two-look test with the same bounds: where the half's gain is above zero but not "
                            "resolved at alpha, the winner alone trains the other half of the whole part from its "
                            "half's checkpoint and the no-gain test reads the whole part (sequential: the round 30 "
                            "candidate, not adopted, docs/demo.md: the whole part resolved a gain in 2 of the 12 runs "
                            "it trained on, and D was -0.0010 over 31 tasks); acts only where race_no_gain is not keep "
                            "and race_gain is resolved")
    no_gain_draw: Literal["mixed", "pool"] = Field(
        "mixed", description="what the no-gain action (race_no_gain) trains: every pool prompt whose group is mixed at "
                             "the stage's ranking, informative's candidates, all of them and not filled from the rest "
                             "(mixed: issue 32's revision 26, docs/demo.md round 27; an all-equal group's advantage, "
                             "and so its gradient, is exactly zero, and under token-mean its tokens still dilute the "
                             "step), or the whole pool (pool: revisions 23-25)")
    pool_revisit: Literal["never", "race"] = Field(
        "never", description="a stage after one that ended holding the whole pool by the no-gain action (race_no_gain) "
                             "begins with a race from its start between the ranked subset that action left (its arm "
                             "and fraction) and the pool, run as the arms' race runs; the pool, the decision in "
                             "force, goes on unless the ranked subset's lead over it is resolved one-sided at alpha, "
                             "and the next stage races again while neither lead is resolved (race: the round 26 "
                             "candidate, docs/demo.md); or the pool is kept to the curriculum's end (never: "
                             "revisions 23-25)")
    rerace: Literal["after_reversal", "never"] = Field(
        "after_reversal", description="a stage after one with a confirmed reversal begins with the race stage 0 "
                                      "runs (after_reversal: that fall measured one stage's subset, the next stage "
                                      "ranks again), or goes on with the arm the reversal switched to (never: issue "
                                      "32's revisions 1-7)")
    widen: bool = Field(True, description="double the selected fraction when the subset saturates")
    widen_when: Literal["stalled", "saturated"] = Field(
        "stalled", description="when a kept part widens: only when it is saturated and its rise over the best it "
                               "was judged against is not resolved at alpha (stalled: issue 32's revision 16, "
                               "docs/demo.md round 16; the zero share says the subset gives fewer nonzero gradients "
                               "a step, the reading says whether those still move the targets), or whenever it "
                               "reads saturated (saturated: revisions 4-12)")
    widen_check: Literal["none", "race"] = Field(
        "none", description="what a saturated part's widening is: at once (none: issue 32's revisions 4-12), or a "
                            "race over the stage's next part from that part's checkpoint between the current subset "
                            "and the doubled one, the higher validation reading going on, a tie to the wider (race: "
                            "the revision 13 candidate, docs/demo.md); a race needs two parts of the stage's steps, "
                            "else it begins the next stage")
    confirm_on: Literal["held_out_prompts", "check_prompts"] = Field(
        "held_out_prompts", description="what a fall is confirmed on (on a fresh random stream either way): "
                                        "validation prompts the check never read (a set needs twice the sample), "
                                        "or the check's own prompts (issue 32's revision 2)")
    at_whole_pool: Literal["revert", "keep"] = Field(
        "revert", description="a confirmed fall at the whole pool, where no other subset or wider fraction exists: "
                              "restore the stage's best and train the pool on from it (revert), or record the "
                              "screen as no_fallback and keep the part (keep: issue 32's revision 5, which measured "
                              "lower on skills, docs/demo.md)")
    screen: Literal["split", "alpha"] = Field(
        "split", description="the level of the screen that asks for a confirmation: alpha split over the stage's "
                             "checks, as the confirmation's (split: issue 32's revisions 3-12, whose two tests at "
                             "that level reach power 0.61-0.70 of the stated power, docs/demo.md), or alpha itself "
                             "(alpha: the revision 14 candidate; the confirmation alone, read on prompts and a stream "
                             "the best was not chosen on, holds the stage's fallbacks under alpha)")
    test: Literal["t", "normal"] = Field(
        "t", description="the reference distribution of a screen's and a confirmation's change over its SE: "
                         "Student's t at the Welch-Satterthwaite degrees of freedom of the SE (the SE is estimated "
                         "from the prompts read, so under no change the ratio follows t), or the normal (issue 32's "
                         "revisions 1-6, which err above the stated rate: 0.0171 against 0.0125 at 21 prompts, "
                         "docs/demo.md)")
    refresh: Literal["blind_spot", "status", "never"] = Field(
        "blind_spot", description="at every stage after the first, re-collect the pool prompts a fresh group at the "
                              "stage's checkpoint would more likely than not find in the other status and rank them "
                              "on their fresh groups (a curriculum's own 'refresh' takes precedence): both ways, "
                              "mixed <-> all-equal (status: issue 32's revision 9), or only theta_0's all-equal "
                              "groups, whose gradient is zero whatever the policy unlearned (blind_spot: revision "
                              "10); or rank theta_0's groups only (never: revisions 1-8, docs/demo.md)")
    widened: Literal["filled", "no_harm", "selection"] = Field(
        "filled", description="what a widened fraction f (above the curriculum's select_fraction) trains: "
                              "ceil(f N) prompts, the arm's selection and then a uniform seeded draw from the pool "
                              "prompts it left out, so that fraction 1 is the pool (filled: issue 32's revision 11), "
                              "or the same drawn from the pool less its prompts of negative gain at the stage's "
                              "ranking, a first-order prediction that they lower the validation objective, all of "
                              "the rest where fewer remain (no_harm: the round 17 candidate, docs/demo.md), "
                              "or the arm's selection alone, which a ranking selector's candidates cut short (at "
                              "fraction 1 CROPI's rule trained 682-767 of 1,200 skills prompts, diverse 366-405: "
                              "selection, revisions 1-10, docs/demo.md)")
    sizing: Literal["stage_start", "theta_0"] = Field(
        "stage_start", description="the per-prompt pass-rate variance a stage's validation sample is sized from: at the "
                               "checkpoint the stage starts from (theta_0's offline trajectories at stage 0, the "
                               "previous checked stage's end reading after it), per set at least resolve (1 - "
                               "resolve), the variance a fall of resolve from a pass rate of 0 or 1 meets "
                               "(stage_start: issue 32's revision 12); or theta_0's at every stage, without a floor "
                               "(theta_0: revisions 1-11, docs/demo.md)")
    saturation_reference: Literal["theta_0", "stage_start"] = Field(
        "theta_0", description="what a part's all-equal share is tested against: theta_0's pool share, from its "
                               "offline trajectories (theta_0: issue 32's revisions 4-12), or, at every stage after "
                               "the first, the share of a uniform sample of the pool read at the stage's start "
                               "checkpoint, as many prompts as a part draws groups, in a two-sample test "
                               "(stage_start: exploratory, docs/demo.md)")
    best_of: Literal["stage", "run"] = Field(
        "run", description="the best checkpoint a fall is measured against and restored to: the stage's own, or "
                           "the curriculum's so far (a stage starts with the previous stage's best when it reads "
                           "higher: falls below one stage's margin cannot add up over stages; issue 32's revision 6)")


def z_value(p: float) -> float:
    """The standard normal quantile ``Phi^-1(p)``."""
    return _NORMAL.inv_cdf(p)


def reversal_z(options: CheckOptions, checks: int) -> float:
    """One-sided ``z`` at ``alpha`` split over the stage's ``checks`` comparisons (Bonferroni)."""
    return z_value(1 - options.alpha / max(checks, 1))


def screen_z(options: CheckOptions, checks: int) -> float:
    """The screen's level as a normal quantile: ``reversal_z`` (``screen: split``), or one-sided at ``alpha``
    itself (``alpha``). The confirmation stays at ``reversal_z``: read on fresh prompts and a fresh stream it is
    independent of how the best was chosen, so over a stage's ``checks`` confirmations the union bound holds the
    chance of a fallback under ``alpha`` at any screen level (benchmarks/check_power.py)."""
    return reversal_z(options, checks) if options.screen == "split" else z_value(1 - options.alpha)


def paired_change(after: Mapping[str, np.ndarray], before: Mapping[str, np.ndarray]) -> tuple[float, float]:
    """Change of the objective (mean over sets of the per-prompt mean) and its standard error.

    Both read the same prompts of every set, so per set the change is the mean of the per-prompt
    differences ``d`` and its variance ``var(d) / n`` (unbiased, n - 1); the objective weighs the ``J``
    sets equally: ``SE^2 = sum_j var_j(d) / (J^2 n_j)``."""
    change, se, _ = paired_change_df(after, before)
    return change, se


def paired_change_df(after: Mapping[str, np.ndarray],
                     before: Mapping[str, np.ndarray]) -> tuple[float, float, float]:
    """``paired_change`` and the Welch-Satterthwaite degrees of freedom of its SE:
    ``(sum_j u_j)^2 / sum_j u_j^2 / (n_j - 1)`` with ``u_j = var_j(d) / n_j`` (the ``J^2`` cancels). One set:
    ``n - 1``, the paired t-test's. Where every set's differences are constant (SE 0) the margin is 0 whatever
    the quantile; the degrees of freedom are then ``sum_j (n_j - 1)``."""
    sets = sorted(before)
    diffs = [np.asarray(after[s], dtype=np.float64) - np.asarray(before[s], dtype=np.float64) for s in sets]
    mean = float(np.mean([d.mean() for d in diffs]))
    parts = [((d.var(ddof=1) if len(d) > 1 else 0.25) / len(d), max(len(d) - 1, 1)) for d in diffs]
    var = sum(u for u, _ in parts) / len(sets) ** 2
    denominator = sum(u * u / dof for u, dof in parts)
    df = sum(u for u, _ in parts) ** 2 / denominator if denominator > 0 else float(sum(dof for _, dof in parts))
    return mean, math.sqrt(var), df


def critical(z: float, df: float, test: str) -> float:
    """The one-sided critical value at the level ``Phi(z)`` (the plan keeps the normal quantile ``z``): ``z``
    itself for the normal test, Student's quantile at ``df`` degrees of freedom for ``t``."""
    if test == "normal":
        return z
    from scipy.stats import t as student  # scipy: the t quantile (Student's inverse CDF is not in the stdlib)

    return float(student.ppf(_NORMAL.cdf(z), df))


def objective(values: Mapping[str, np.ndarray]) -> float:
    """Mean over the sets of the mean per-prompt pass rate."""
    return float(np.mean([np.mean(v) for v in values.values()]))


def sample_size(variance: float, options: CheckOptions, sets: int, checks: int, samples: int | None = None) -> int:
    """Prompts per set so that a fall of ``resolve`` is detected with ``power`` at the reversal ``z``:
    the paired change of one prompt has variance ``2 v / k`` (two independent draws of ``k`` samples
    where nothing changed; ``k``: ``samples``, else the options'), the objective averages ``J`` sets of ``n``:
    ``SE^2 = 2 v / (k J n)``."""
    z = reversal_z(options, checks) + z_value(options.power)
    k = samples or options.samples
    return max(2, math.ceil(z * z * 2 * variance / (k * sets * options.resolve ** 2)))


def fit_samples(variance: float, options: CheckOptions, sets: int, checks: int, prompts: int) -> tuple[int, int] | None:
    """``(k, n)``: the fewest draws a prompt, from the options' ``samples`` up to ``MAX_SAMPLES``, at which ``n
    <= prompts`` prompts a set resolve the fall (``sample_size``); None when not even ``MAX_SAMPLES`` do. Under
    no change a prompt's paired change has variance ``2 v / k``, so draws stand in for prompts one for one in
    the SE; a small validation set keeps its check at the same power and about the same cost (``n k``)."""
    for k in range(options.samples, MAX_SAMPLES + 1):
        n = sample_size(variance, options, sets, checks, samples=k)
        if n <= prompts:
            return k, n
    return None


def race_draws(budget: int, prompts: int, floor: int) -> int:
    """Draws a prompt for a race's reading of ``prompts`` prompts: the most whose generations stay within
    ``budget`` (what the race's second half trains one arm on), at least ``floor`` (the check's), at most
    ``MAX_SAMPLES``."""
    return max(floor, min(MAX_SAMPLES, budget // max(prompts, 1)))


def prompt_variance(rewards: Sequence[Sequence[float]]) -> float:
    """Mean unbiased ``p (1 - p)`` over prompts from their offline rewards (``K/(K-1) p^(1 - p^)``)."""
    rates = [(sum(1.0 for x in r if x and x > 0) / len(r), len(r)) for r in rewards if len(r) >= 2]
    return _mean_unbiased(rates)


def reading_variance(rates: Sequence[float], draws: int) -> float:
    """``prompt_variance`` from a check's reading: each prompt's pass rate over ``draws`` draws."""
    return _mean_unbiased([(float(p), draws) for p in rates] if draws >= 2 else [])


def _mean_unbiased(rates: Sequence[tuple[float, int]]) -> float:
    """Mean over ``(p^, k)`` of ``k/(k-1) p^(1 - p^)``, unbiased for ``p (1 - p)``; 0.25 (its largest) for none."""
    return float(np.mean([k / (k - 1) * p * (1 - p) for p, k in rates])) if rates else 0.25


def planned_variance(variance: float, options: CheckOptions) -> float:
    """The variance a sample is sized from under ``sizing: stage_start``: at least ``resolve (1 - resolve)``."""
    return max(variance, options.resolve * (1 - options.resolve))


def flat_share(correct: Sequence[int], k: int, n: int) -> float:
    """The pool's expected share of all-equal groups of ``n`` rollouts: per prompt with ``x`` of ``k``
    offline rewards correct, ``[C(x,n) + C(k-x,n)] / C(k,n)`` is the unbiased estimate of
    ``p^n + (1-p)^n`` (drawing ``n`` of the ``k`` without replacement); needs ``n <= k``."""
    if not correct:
        return 0.0
    n = min(n, k)
    total = math.comb(k, n)
    return float(np.mean([(math.comb(x, n) + math.comb(k - x, n)) / total for x in correct]))


def saturated(share: float, groups: int, pool_share: float, options: CheckOptions,
              pool_prompts: int | None = None) -> bool:
    """The part's all-equal share above the pool's by more than ``z_{1-alpha}`` SEs: the part's binomial SE where the
    pool's share is taken as known (theta_0's, from the whole pool's offline groups); with ``pool_prompts``, the pool's
    share read on that many prompts, the two-sample SE of the difference, ``sqrt(p (1 - p) (1/G + 1/n))`` at the
    pooled share ``p`` (under no difference both samples estimate the same share)."""
    if groups <= 0:
        return False
    if pool_prompts:
        pooled = (share * groups + pool_share * pool_prompts) / (groups + pool_prompts)
        se = math.sqrt(max(pooled * (1 - pooled), 1e-12) * (1 / groups + 1 / pool_prompts))
    else:
        se = math.sqrt(max(share * (1 - share), 1e-12) / groups)
    return share - pool_share > z_value(1 - options.alpha) * se


def all_equal_share(rates: np.ndarray) -> float:
    """The share of prompts whose draws all agree (a pass rate of 0 or 1): all-equal groups, a zero gradient."""
    rates = np.asarray(rates, dtype=np.float64)
    return float(np.mean((rates <= 0) | (rates >= 1))) if len(rates) else 0.0


@dataclass
class Verdict:
    """One check's reading and decision (``record()`` goes into the stage record)."""

    value: float
    change: Optional[float]  # against the best (None at a stage start)
    se: Optional[float]
    margin: Optional[float]
    action: str

    def record(self) -> dict:
        r = lambda x: None if x is None else round(x, 6)  # noqa: E731
        return {"objective": r(self.value), "change": r(self.change), "se": r(self.se), "margin": r(self.margin),
                "action": self.action}


def judge(values: Mapping[str, np.ndarray], best: Mapping[str, np.ndarray], z: float, test: str) -> Verdict:
    """``reverted`` when the objective fell below the best's by more than ``critical`` SEs (at the level of the
    normal quantile ``z``, from Student's t at the SE's degrees of freedom with ``test="t"``), else ``kept``."""
    change, se, df = paired_change_df(values, best)
    margin = critical(z, df, test) * se
    return Verdict(objective(values), change, se, margin, "reverted" if change < -margin else "kept")


def race_lead(winner: Mapping[str, np.ndarray], loser: Mapping[str, np.ndarray], alpha: float, test: str) -> dict:
    """How far a race's winner read above its loser, and whether the sample resolves that lead: the paired change
    of the winner's reading over the loser's (both arms are read on the same prompts and random stream), its SE
    and degrees of freedom (``paired_change_df``), and the one-sided critical value at ``alpha`` for this one
    comparison. The race keeps the arm that reads higher whatever this says (docs/demo.md, "What a race resolves":
    on the six tasks measured, the arm that loses an unresolved race did no better over the run than the one that
    won it, primary or not); what it decides is whether a sequential race looks again, whether a saturated part is
    still rising, and (``race_gain: resolved``) whether the winner's reading over the stage's start is a gain."""
    lead, se, df = paired_change_df(winner, loser)
    level = critical(z_value(1 - alpha), df, test)
    return {"lead": round(lead, 6), "se": round(se, 6), "df": round(df, 2), "critical": round(level, 4),
            "alpha": alpha, "resolved": bool(lead > level * se)}


def confirmed(screen: Verdict, fresh: Verdict) -> Verdict:
    """The screen's verdict, a reversal only if the fresh reading's own test (``judge`` on a new stream)
    reverts too; else ``unconfirmed`` (the part is kept)."""
    if screen.action != "reverted" or fresh.action == "reverted":
        return screen
    return Verdict(screen.value, screen.change, screen.se, screen.margin, "unconfirmed")


def without_fallback(screen: Verdict) -> Verdict:
    """A fired screen with nowhere to fall back to (the whole pool: both arms select it and no fraction is
    wider): recorded as ``no_fallback``, the part kept. A restore would train the same data again from the
    same checkpoint (issue 32's revision 5, docs/demo.md)."""
    if screen.action != "reverted":
        return screen
    return Verdict(screen.value, screen.change, screen.se, screen.margin, "no_fallback")


def stream_seed(seed: int, stream: str) -> int:
    """The sampling seed of a named random stream of a check's seed ('' : the seed itself)."""
    if not stream:
        return seed
    return int.from_bytes(hashlib.sha256(f"cropi.check:{seed}:{stream}".encode()).digest()[:4], "little")


class ValidationSample:
    """A fixed sample of each validation set's prompts, measured at a checkpoint with the same random
    stream every time (the draws are seeded by the check's seed and each prompt's id)."""

    def __init__(self, records: Mapping[str, list], seed: int, samples: int):
        self.records, self.seed, self.samples = dict(records), seed, samples

    @classmethod
    def draw(cls, sets: Mapping[str, list], n: int, seed: int, samples: int) -> "ValidationSample":
        """``n`` prompts of each set (all of a smaller one), drawn once from ``seed``."""
        chosen = {}
        for name, recs in sorted(sets.items()):
            recs = sorted(recs, key=lambda r: r.prompt_id)
            chosen[name] = random.Random(f"cropi.check:{seed}:{name}").sample(recs, min(n, len(recs)))
        return cls(chosen, seed, samples)

    @classmethod
    def draw_pair(cls, sets: Mapping[str, list], n: int, seed: int,
                  samples: int) -> tuple["ValidationSample", "ValidationSample"]:
        """The check's sample (``draw``) and a disjoint one of up to ``n`` prompts a set from the rest of each
        set, drawn from its own seed: what a fall is confirmed on."""
        check = cls.draw(sets, n, seed, samples)
        held_out = {}
        for name, recs in sorted(sets.items()):
            used = {r.prompt_id for r in check.records[name]}
            rest = sorted((r for r in recs if r.prompt_id not in used), key=lambda r: r.prompt_id)
            held_out[name] = random.Random(f"cropi.check.confirm:{seed}:{name}").sample(rest, min(n, len(rest)))
        return check, cls(held_out, seed, samples)

    @classmethod
    def beside(cls, sets: Mapping[str, list], held_out: "ValidationSample | None", seed: int,
               samples: int) -> "ValidationSample":
        """Every prompt of each set but ``held_out``'s (all of them where it is None), in prompt-id order: what a
        race reads under ``race_sample: rest``, the check's sample among them."""
        kept = {(n, r.prompt_id) for n, recs in (held_out.records.items() if held_out else ()) for r in recs}
        return cls({n: [r for r in sorted(recs, key=lambda r: r.prompt_id) if (n, r.prompt_id) not in kept]
                    for n, recs in sets.items()}, seed, samples)

    def size(self) -> dict[str, int]:
        return {k: len(v) for k, v in self.records.items()}

    def measure(self, checkpoint: str, *, reward: str, temperature: float, max_new_tokens: int,
                device: str = "cpu", stream: str = "") -> tuple[dict[str, np.ndarray], float]:
        """Per set, each prompt's pass rate over ``samples`` draws at ``checkpoint`` on the named random
        ``stream`` (``stream_seed``); and the seconds it took."""
        from cropi.generation.base import SamplingConfig
        from cropi.generation.hf import HFBackend
        from cropi.generation.prompting import render_prompt
        from cropi.rewards import get_reward, score_responses

        started = time.monotonic()
        backend = HFBackend(checkpoint, device=device, max_batch_rows=512)
        fn = get_reward(reward)
        cfg = SamplingConfig(samples=self.samples, temperature=temperature, max_new_tokens=max_new_tokens,
                             seed=stream_seed(self.seed, stream))
        out = {}
        try:
            for name, recs in self.records.items():
                ids = [render_prompt(backend.tokenizer, r.prompt) for r in recs]
                groups = backend.generate(ids, [r.prompt_id for r in recs], cfg)
                out[name] = np.array([np.mean([1.0 if (x or 0) > 0 else 0.0 for x in
                                               score_responses(fn, [s.text for s in g], r.answer)])
                                      for r, g in zip(recs, groups)])
        finally:
            backend.close()
        return out, time.monotonic() - started


def as_lists(values: Mapping[str, np.ndarray]) -> dict[str, list[float]]:
    return {k: [float(x) for x in v] for k, v in values.items()}


def from_lists(values: Mapping[str, Sequence[float]]) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, dtype=np.float64) for k, v in values.items()}
