"""The images' Python dependencies are pinned with hashes, and the pins are what pyproject.toml asks for.

docker/*-requirements.txt come from ``make image-lock`` (pip-compile --generate-hashes); the Dockerfile
installs them with ``--require-hashes`` and gpuzombie's own wheel with ``--no-deps``, so two builds of
one commit install the same files (issue 18: unpinned, they did not have to).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

pytest.importorskip("packaging", reason="packaging (pip's own) parses the requirements")

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]


def lock(name: str) -> dict[str, tuple[str, int]]:
    """{distribution: (pinned version, number of hashes)} of docker/<name>-requirements.txt."""
    text = (DOCKER / f"{name}-requirements.txt").read_text()
    pins = {}
    for entry in re.split(r"\n(?=[A-Za-z])", text[text.index("\n", text.index("\n#\n") + 1) :].strip()):
        head = entry.split(" \\", 1)[0].strip()
        if head.startswith("#") or not head:
            continue
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", head)
        assert match, f"{name}: not pinned with ==: {head}"
        pins[canonicalize_name(match[1])] = (match[2], entry.count("--hash=sha256:"))
    return pins


def wanted(*extras: str) -> list[Requirement]:
    """The project's requirements with those extras, itself (gpuzombie[node]) left out."""
    specs = [*PROJECT["dependencies"], *(s for e in extras for s in PROJECT["optional-dependencies"][e])]
    return [r for r in map(Requirement, specs) if canonicalize_name(r.name) != "gpuzombie"]


LOCKS = {
    "node": wanted("exporter", "node", "top"),
    "workload": wanted(),
    "build": [Requirement(s) for s in PYPROJECT["build-system"]["requires"]],
}


@pytest.mark.parametrize("name", list(LOCKS))
def test_every_pin_has_hashes(name):
    pins = lock(name)
    assert pins and all(hashes >= 1 for _, hashes in pins.values()), pins


@pytest.mark.parametrize("name", list(LOCKS))
def test_the_lock_satisfies_pyproject(name):
    """A requirement changed in pyproject.toml and not re-locked fails here: run make image-lock."""
    pins = lock(name)
    for requirement in LOCKS[name]:
        key = canonicalize_name(requirement.name)
        assert key in pins, f"{name} lock lacks {requirement}: run make image-lock"
        assert requirement.specifier.contains(pins[key][0], prereleases=True), (requirement, pins[key])


def test_the_dockerfile_installs_only_hashed_locks_and_its_own_wheel():
    text = (DOCKER / "Dockerfile").read_text().replace("\\\n", " ")
    installs = re.findall(r"pip install ([^&\n]*)", text)
    assert installs
    for args in installs:
        locked = re.search(r"--require-hashes -r /tmp/(\w+)-requirements\.txt", args)
        assert (locked and locked[1] in LOCKS) or ("--no-deps" in args and "/tmp/wheels/" in args), args
    assert "--no-build-isolation" in text  # the wheel is built with the locked setuptools
