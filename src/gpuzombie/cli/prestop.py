"""`gpuzombie prestop` (being built)."""

import click

from gpuzombie.errors import GpuzombieError


@click.command()
def command() -> None:
    """Not built yet."""
    raise GpuzombieError("'prestop' is not built yet")
