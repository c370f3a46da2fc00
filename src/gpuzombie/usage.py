"""argparse for the stdlib-only zipapp entry points (the fast preStop hook, the preflight gate): a
usage error is raised, to be reported as one line, instead of argparse's usage block and exit 2."""

from __future__ import annotations

import argparse
from typing import NoReturn


class UsageError(Exception):
    pass


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)
