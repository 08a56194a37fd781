"""The command layer: `sweep <verb> [overrides]` (``commands``) and its help (``help``)."""

from sweep.cli.commands import COMMANDS, compose_for, main

__all__ = ["COMMANDS", "compose_for", "main"]
