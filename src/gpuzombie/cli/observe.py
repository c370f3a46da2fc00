"""`gpuzombie observe` (being built)."""

import click

from gpuzombie.errors import GpuzombieError


@click.command()
def command() -> None:
    """Not built yet."""
    raise GpuzombieError("'observe' is not built yet")
