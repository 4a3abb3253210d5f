"""``python -m cropi_service``: same as ``cropi serve`` plus the standalone ``worker`` mode."""

from .entry.cli import main

raise SystemExit(main())
