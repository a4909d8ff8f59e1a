"""The exit codes of every command: ``meteorseed ...`` (cli/), ``scrapy seed-expand``
(commands/) and its scrapy-redis migration (migrate/). Its own layer, below all of them, and
imports nothing: a command imports it even for ``--help``."""

from __future__ import annotations

EXIT_OK = 0
#: The command ran but something asked for was not done (an unknown id, a dead letter that
#: cannot be requeued, a rejected seed or entry, an operator who answered "no").
EXIT_INCOMPLETE = 1
#: The command could not run, or stopped (Redis unreachable or failing, unreadable input,
#: refused without ``--yes``).
EXIT_ERROR = 2

__all__ = ["EXIT_ERROR", "EXIT_INCOMPLETE", "EXIT_OK"]
