"""Transitional: ``cropi serve`` of the current cropi/cli.py imports ``services.cli.serve``.
Delete this file once cropi/cli.py dispatches ``serve`` through the "cropi.commands" entry point."""

from .entry.cli import serve  # noqa: F401
