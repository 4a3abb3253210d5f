"""``python -m services``: same as ``cropi serve`` plus the standalone ``worker`` mode."""

from services.cli import main

raise SystemExit(main())
