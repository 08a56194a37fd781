"""Early-exit sweep orchestrator: does a model admit early exit, and at what cost?

Importing this package starts nothing (no Ray, no model load, no logging set-up);
the entry points live in ``sweep.cli.commands`` and ``jobs/``.
"""

__version__ = "0.1.0"
