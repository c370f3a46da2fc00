"""The NRI plugin (go/nri) decides as the webhook does: the constants it embeds are the webhook's,
its fixture file is what tests/nri_cases.py makes from the webhook's cases now, and the built
binary's ``decide`` gives every container of those pods the webhook's argv, except the differences
nri_cases names (each of which must still differ). Its Go module is gofmt-clean, vetted and its own
``go test`` passes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

import nri_cases
from gpuzombie.cluster.build import NRI_PLUGIN_ENV, NriSource, ensure_nri_plugin

REGENERATE = "PYTHONPATH=src:tests python tests/nri_cases.py"


def test_the_contract_is_the_webhooks() -> None:
    assert json.loads(nri_cases.CONTRACT.read_text()) == nri_cases.contract(), f"run {REGENERATE}"


def test_the_fixture_file_is_current() -> None:
    assert json.loads(nri_cases.DECISIONS.read_text()) == nri_cases.decisions(), f"run {REGENERATE}"


@pytest.fixture(scope="module")
def plugin() -> str:
    if shutil.which("go") is None and not os.environ.get(NRI_PLUGIN_ENV):
        pytest.skip(f"no Go toolchain to build go/nri (or {NRI_PLUGIN_ENV})")
    return str(ensure_nri_plugin(lambda line: None))


def test_the_plugin_decides_as_the_webhook(plugin: str) -> None:
    data = nri_cases.decisions()
    lines = "".join(json.dumps({"pod": c["pod"], "container": c["nri"]}) + "\n" for c in data["cases"])
    skip = [f"--skip-namespace={ns}" for ns in data["skip_namespaces"]]
    done = subprocess.run(
        [plugin, "decide", *skip], input=lines, capture_output=True, text=True, timeout=60, check=True
    )
    verdicts = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(verdicts) == len(data["cases"])
    wrong, stale, fixed = [], [], 0
    for case, verdict in zip(data["cases"], verdicts, strict=True):
        same = verdict["args"] == case["webhook"]
        where = f"{case['case']}, {case['container']}"
        if case["differs"] is None and not same:
            wrong.append(f"{where}: plugin {verdict['args']}, webhook {case['webhook']}")
        elif case["differs"] is not None and same:
            stale.append(f"{where}: listed as a difference but both give {verdict['args']}")
        fixed += bool(same and verdict["args"])
    assert not wrong, "\n".join(wrong)
    assert not stale, "\n".join(stale)
    assert fixed >= 30, "the fixture set lost the pods the webhook fixes"


def test_every_webhook_fix_is_the_plugins_where_it_sees_the_argv() -> None:
    """What the webhook runs under tini, the plugin does too: no case the webhook fixes by tini is
    a listed difference (the differences are the webhook's shared namespaces and its skips)."""
    wrapped = [c for c in nri_cases.cases() if c["webhook"] is not None]
    assert wrapped and all(c["differs"] is None for c in wrapped)


@pytest.mark.slow
def test_the_go_module_is_clean() -> None:
    """gofmt, go vet and go test, as every Go module of the tree (go test reads the fixture file)."""
    go = shutil.which("go")
    if go is None:
        pytest.skip("no Go toolchain")
    directory = NriSource.locate().directory
    unformatted = subprocess.run(
        ["gofmt", "-l", "."], cwd=directory, capture_output=True, text=True, timeout=120, check=True
    )
    assert unformatted.stdout == "", f"gofmt: {unformatted.stdout}"
    for argv in ([go, "vet", "./..."], [go, "test", "-count=1", "./..."]):
        done = subprocess.run(argv, cwd=directory, capture_output=True, text=True, timeout=600, check=False)
        assert done.returncode == 0, f"{' '.join(argv[1:])}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
