"""`gpuzombie trace` (being built)."""

import click

from gpuzombie.errors import GpuzombieError


@click.command()
def command() -> None:
    """Not built yet."""
    raise GpuzombieError("'trace' is not built yet")
