"""Influence scoring: validation vectors, cosine scores, fusion, selection."""

from cropi.scoring.fusion import FUSIONS, fuse, order, ranks
from cropi.scoring.influence import cosine_scores, validation_vector
from cropi.scoring.ranking import Ranking, rank_pool
from cropi.scoring.selection import select_top

__all__ = ["FUSIONS", "Ranking", "cosine_scores", "fuse", "order", "rank_pool", "ranks",
           "select_top", "validation_vector"]
