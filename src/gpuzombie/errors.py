"""The one exception type the CLI turns into a one-line message and an exit code."""

from gpuzombie.exitcodes import ExitStatus


class GpuzombieError(Exception):
    """An expected failure with a message fit for one line of stderr."""

    def __init__(self, message: str, status: ExitStatus = ExitStatus.ERROR) -> None:
        super().__init__(message)
        self.status = status


def needs_extra(what: str, extra: str, exc: ImportError) -> str:
    """One line naming the pyproject extra ``what`` needs, installed from the clone into the project
    venv (`make lab` makes it). Never a bare `gpuzombie[...]` requirement: gpuzombie is not on PyPI, and
    that would install whatever a stranger published under the name."""
    return f"{what} needs the '{extra}' extra: in the gpuzombie clone run .venv/bin/pip install -e '.[{extra}]' ({exc})"
