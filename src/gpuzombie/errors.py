"""The one exception type the CLI turns into a one-line message and an exit code."""

from gpuzombie.exitcodes import ExitStatus


class GpuzombieError(Exception):
    """An expected failure with a message fit for one line of stderr."""

    def __init__(self, message: str, status: ExitStatus = ExitStatus.ERROR) -> None:
        super().__init__(message)
        self.status = status
