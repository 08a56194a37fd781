"""The command layer: `sweep <verb> [overrides]` (``commands``) and its help (``help``)."""

from sweep.cli.commands import main

__all__ = ["main"]
