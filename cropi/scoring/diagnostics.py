"""What a selection is made of, against its pool: data-source shares and answer-label skew.

A gradient-similarity ranking can pick by answer label rather than by skill: with short
answers from a small label set (multiple choice, yes/no, one-digit numbers) a prompt's
gradient is dominated by the push on its answer tokens, so the prompts whose answer the
validation gradient currently favours rank first, and training on them teaches a constant
answer (docs/demo.md, the ``skills`` task). What shows it: per data source, the share of
the most common answer among the selected prompts against the pool's own. A selection
whose modal-answer share exceeds the pool's by more than ``SKEW_THRESHOLD`` (over at least
``MIN_SELECTED`` selected prompts of that source) gets a ``label_skew`` warning.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Iterable, Mapping, Sequence

import numpy as np

SKEW_THRESHOLD = 0.2
MIN_SELECTED = 10
LABEL_SKEW = "label_skew"
FIELD_SKEW = "field_skew"
CONCENTRATED = "concentrated_selection"
SILENT_VALIDATION = "silent_validation_set"  # a validation set without one ok prompt: ranked without it
FILLED_TO_BATCH = "filled_to_batch"  # a stage subset smaller than the trainer's batch, filled from the pool
TURNED_OVER = "ranking_turned_over"  # a stage's ranking unrelated to the last stage's: the model moved past it
SHELF_LIFE = "benchmarks/results/demo/shelf_life/"  # where the rankings' turnover was measured

Labelled = tuple[str, str]  # (data_source, answer)


def selection_mix(selected: Sequence[str], pool: Mapping[str, Labelled]) -> dict:
    """Per data source: pool and selection shares, and the modal answer's share in each; warnings.

    ``pool`` maps every pool prompt id to its (data_source, answer); ``selected`` are ids of it.
    """
    unknown = [p for p in selected if p not in pool]
    if unknown:
        raise KeyError(f"{len(unknown)} selected prompts are not in the pool (e.g. {unknown[:3]})")
    chosen = [pool[p] for p in selected]
    every = list(pool.values())
    in_pool, in_sel = _by_source(every), _by_source(chosen)
    sources = {}
    for source in sorted(in_pool):
        answers, picked = in_pool[source], in_sel.get(source, Counter())
        sources[source] = {
            "pool_share": sum(answers.values()) / len(every),
            "selected_share": sum(picked.values()) / len(chosen) if chosen else 0.0,
            "selected": sum(picked.values()),
            "pool_modal_answer_share": _modal_share(answers),
            "selected_modal_answer": picked.most_common(1)[0][0] if picked else None,
            "selected_modal_answer_share": _modal_share(picked) if picked else None,
        }
    return {"n": len(chosen), "pool_n": len(every), "sources": sources, "warnings": skew_warnings(sources)}


def skew_warnings(sources: Mapping[str, dict]) -> list[dict]:
    """A ``label_skew`` warning for every source whose selection is skewed toward one answer."""
    out = []
    for source, row in sources.items():
        share = row["selected_modal_answer_share"]
        if share is None or row["selected"] < MIN_SELECTED:
            continue
        excess = share - row["pool_modal_answer_share"]
        if excess > SKEW_THRESHOLD:
            out.append({"code": LABEL_SKEW, "data_source": source, "answer": row["selected_modal_answer"],
                        "selected_share": share, "pool_share": row["pool_modal_answer_share"],
                        "message": f"{share:.0%} of the selected {source!r} prompts have the answer "
                                   f"{row['selected_modal_answer']!r} against {row['pool_modal_answer_share']:.0%} "
                                   "in the pool: the ranking may be picking an answer label, and training on it "
                                   "can teach a constant answer. Check the subset, or rank with validation "
                                   "vectors grouped by answer (validation_groups='answer')"})
    return out


def field_skew(selected: Sequence[str], fields: Mapping[str, Mapping[str, str]]) -> dict:
    """Label skew for any record field (``fields``: field -> prompt_id -> value, over the whole pool).

    A latent feature a ranking can pick by while the answers themselves look spread: in the
    ``lists`` demo, the answer's position in the list (docs/demo.md). Per field: the selection's
    most common value with its share, against that value's share in the pool; a ``field_skew``
    warning when the selection's share exceeds the pool's by more than ``SKEW_THRESHOLD``.
    """
    out, warnings = {}, []
    for name, values in fields.items():
        pool, picked = Counter(values.values()), Counter(values[p] for p in selected if p in values)
        if not picked:
            continue
        value, count = picked.most_common(1)[0]
        row = {"value": value, "selected_share": count / sum(picked.values()),
               "pool_share": pool[value] / sum(pool.values())}
        out[name] = row
        if sum(picked.values()) >= MIN_SELECTED and row["selected_share"] - row["pool_share"] > SKEW_THRESHOLD:
            warnings.append({"code": FIELD_SKEW, "field": name, "value": value, **row,
                             "message": f"{row['selected_share']:.0%} of the selected prompts have {name}={value!r} "
                                        f"against {row['pool_share']:.0%} in the pool: the ranking may be picking a "
                                        "feature the targets share by chance (a shortcut), which training then "
                                        "teaches. Check the subset, or use a selector that bounds the subset's "
                                        "concentration (selector 'diverse')"})
    return {"fields": out, "warnings": warnings}


def alignment(selected: np.ndarray, pool: np.ndarray, batch: int | None = None) -> dict:
    """How much the selected prompts' gradients agree, against a random draw of the pool's.

    ``selected`` and ``pool`` are gradient rows (zero rows, prompts without signal, are left
    out). ``selection_alignment`` is the selection's mean pairwise cosine; ``random_alignment``
    the pool's, which is what a uniform random draw has in expectation. With the trainer's
    ``batch`` prompts a step, a batch of ``B`` such unit gradients has a shared part of squared
    norm about ``B c`` against ``1 - c`` of the rest (``batch_signal_to_noise = B c / (1 - c)``):
    above 1 the shared direction dominates every batch and AdamW steps along it at full size
    each step, where the learning rate was tuned for the pool's spread; that warns.
    """
    def mean_cos(rows: np.ndarray) -> float | None:
        total, n = np.zeros(np.shape(rows)[1]), 0
        for start in range(0, len(rows), 65_536):  # a million-row pool is summed without a float64 copy
            block = np.asarray(rows[start:start + 65_536], dtype=np.float64)
            norms = np.linalg.norm(block, axis=1)
            total += (block[norms > 0] / norms[norms > 0, None]).sum(axis=0)
            n += int((norms > 0).sum())
        return float((total @ total - n) / (n * (n - 1))) if n >= 2 else None

    sel, rand = mean_cos(selected), mean_cos(pool)
    return {"selection_alignment": sel, "random_alignment": rand} | concentration(sel, rand, batch)


def concentration(sel: float | None, rand: float | None, batch: int | None) -> dict:
    """``batch_signal_to_noise`` of a selection whose mean pairwise cosine is ``sel`` (see ``alignment``),
    and the ``concentrated_selection`` warning when it reaches 1."""
    out: dict = {"warnings": []}
    if not batch or sel is None or sel >= 1:
        return out
    snr = batch * sel / (1 - sel)
    out["batch_signal_to_noise"] = snr
    if snr >= 1:
        out["warnings"].append({
            "code": CONCENTRATED, "selection_alignment": sel, "random_alignment": rand,
            "message": f"the selected prompts' gradients agree (mean pairwise cosine {sel:.3f} against "
                       f"{rand if rand is None else round(rand, 3)} for a random draw): in batches of {batch} their "
                       f"shared direction outweighs the rest ({snr:.1f}x), so AdamW steps along it at full size "
                       "every step. That is a risk, not a verdict: it is how such a subset trains the targets fast "
                       "when the shared direction is the skill, and how it overshoots into a shortcut when it is "
                       "not, and only the validation sets tell which once training starts. A checked curriculum "
                       "(check.enabled, the default) measures them after every part of the stage and, on a fall "
                       "beyond their noise, restores the stage's best checkpoint and goes on with its fallback "
                       "selector ('diverse', which bounds the concentration); unchecked, watch them yourself"})
    return out


def ranking_change(current: Mapping[str, float], previous: Mapping[str, float], k: int,
                   alpha: float = 0.05) -> dict:
    """How much a checkpoint's ranking agrees with the last stage's (prompt -> fused score, the ranked prompts of
    each): Spearman's rho over the prompts both ranked, and the share of the current top ``k`` in the previous
    top ``k`` beside what a random order shares (k / n). A ``ranking_turned_over`` warning when rho is not above 0
    at ``alpha`` (one-sided; under independence rho sqrt(n - 1) is about standard normal): nothing of the last
    ranking is measurable in this one. ``spearman`` None, and no warning, for fewer than 3 prompts in common or a
    ranking whose scores are all equal (rho undefined).

    Why it is worth saying: scored again from either half of its reused responses, a later checkpoint's ranking
    reproduces itself (split-half Spearman-Brown 0.75-0.86 over six demo tasks), yet consecutive stages' rankings
    agree at -0.02 to 0.07 on five of them (0.45 on the sixth, whose target barely moves), and with stages of 10
    steps at -0.04 to 0.17 (``SHELF_LIFE``). So the turnover is the training's, not the estimate's: the subset a
    stage trains on is current only near the stage's start."""
    from scipy.stats import norm, spearmanr

    common = sorted(set(current) & set(previous))
    n = len(common)
    if n < 3:
        return {"prompts": n, "spearman": None, "warnings": []}
    now, before = np.array([current[p] for p in common]), np.array([previous[p] for p in common])
    if np.ptp(now) == 0 or np.ptp(before) == 0:  # a constant ranking: rho is undefined
        return {"prompts": n, "spearman": None, "warnings": []}
    rho = float(spearmanr(now, before)[0])
    k = max(1, min(k, n))
    top = lambda v: {common[i] for i in np.argsort(-v, kind="stable")[:k]}  # noqa: E731
    shared = len(top(now) & top(before)) / k
    z = rho * (n - 1) ** 0.5
    out = {"prompts": n, "spearman": rho, "z": z, "top_overlap": shared,
           "random_top_overlap": k / n, "warnings": []}
    if z <= norm.ppf(1 - alpha):
        out["warnings"].append({
            "code": TURNED_OVER, "spearman": rho, "prompts": n,
            "message": f"this checkpoint's ranking is unrelated to the last stage's (Spearman {rho:+.2f} over the "
                       f"{n} prompts both ranked, not above 0 at alpha {alpha}; its top {k} shares {shared:.0%} with "
                       f"the last stage's, a random order {k / n:.0%}): the last stage moved the model past what "
                       "one ranking describes. A stage's subset is current only near its start, so what a stage "
                       "trains late on is no better aimed than its candidates at random. Shorter stages or a lower "
                       "learning rate keep a ranking current for longer; the check (check.enabled, the default) "
                       "measures what each part does to the validation sets instead of trusting the ranking. "
                       f"On the demo's tasks a later ranking reproduces itself at its checkpoint ({SHELF_LIFE})"})
    return out


def _by_source(rows: Iterable[Labelled]) -> dict[str, Counter]:
    out: dict[str, Counter] = defaultdict(Counter)
    for source, answer in rows:
        out[source][answer] += 1
    return out


def _modal_share(answers: Counter) -> float:
    return max(answers.values()) / sum(answers.values())
