"""``cropi demo``: the CROPI curriculum against its baselines, end to end on a CPU.

``run_demo(DemoSettings.quick(), "out/demo")`` runs every method on the synthetic
skills task (cropi.tasks.skills) with the shipped warm-started tiny model and writes report.json,
report.md and PNG plots (see cropi.demo.runner for the phases).
"""

from cropi.demo.settings import DemoSettings


def run_demo(*args, **kwargs):
    """See ``cropi.demo.runner.run_demo`` (imported on call: it pulls in torch and transformers)."""
    from cropi.demo.runner import run_demo as run

    return run(*args, **kwargs)


__all__ = ["DemoSettings", "run_demo"]
