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

SKEW_THRESHOLD = 0.2
MIN_SELECTED = 10
LABEL_SKEW = "label_skew"

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


def _by_source(rows: Iterable[Labelled]) -> dict[str, Counter]:
    out: dict[str, Counter] = defaultdict(Counter)
    for source, answer in rows:
        out[source][answer] += 1
    return out


def _modal_share(answers: Counter) -> float:
    return max(answers.values()) / sum(answers.values())
