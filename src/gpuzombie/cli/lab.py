"""`gpuzombie lab` (being built)."""

import click

from gpuzombie.errors import GpuzombieError


@click.command()
def command() -> None:
    """Not built yet."""
    raise GpuzombieError("'lab' is not built yet")
