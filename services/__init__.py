"""The cropi influence service: a FastAPI app over cropi.pipeline and its persistent job runner.

Layout: ``settings`` (configuration), ``app`` (HTTP routes), ``jobs`` (SQLite job table),
``registry`` (datasets, checkpoints, curricula), ``runner``/``worker`` (job execution in
separate processes or on Ray), ``library`` (the one place that calls into cropi), ``cli``.
"""
