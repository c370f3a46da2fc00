"""The one definition of the units gpuzombie's reports use: bytes everywhere, MiB only when rendered."""

MIB = 1024 * 1024


def mib(n: int) -> float:
    """Bytes to MiB, one decimal: the unit of every memory figure in the JSON reports."""
    return round(n / MIB, 1)
