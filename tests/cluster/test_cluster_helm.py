"""Where the tests' helm comes from (issue 35, item 4): scripts/get-helm.sh builds it from Helm's own Go
module at a pinned version and go.sum hash, not out of another project's npm package. The built binary
names its source module and hash (Go's build info), reports the pinned version, and a pin that does
not match what the module cache or proxy serves stops the script before anything is built or cached."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
from cluster_support import REPO

SCRIPT = REPO / "scripts" / "get-helm.sh"


def pins() -> dict[str, str]:
    return dict(re.findall(r"^(HELM_\w+)=(\S+)$", SCRIPT.read_text(), re.MULTILINE))


def test_the_pins_are_helms_own_module_and_no_npm_package():
    pinned = pins()
    assert pinned["HELM_MODULE"] == "helm.sh/helm/v4"
    assert re.fullmatch(r"v4\.\d+\.\d+", pinned["HELM_VERSION"])
    assert re.fullmatch(r"h1:[A-Za-z0-9+/]{43}=", pinned["HELM_MODULE_SUM"])
    assert "npm pack" not in SCRIPT.read_text() and "aws-cdk" not in SCRIPT.read_text()  # before: an AWS CDK layer


def test_the_built_helm_is_the_pinned_module(helm_binary):
    if os.environ.get("GPUZOMBIE_HELM"):
        pytest.skip("GPUZOMBIE_HELM names a helm of its own")
    if shutil.which("go") is None:
        pytest.skip("go is not installed")
    pinned = pins()
    version = subprocess.run([helm_binary, "version", "--template", "{{.Version}}"], capture_output=True, text=True)
    assert version.stdout == pinned["HELM_VERSION"], version.stderr
    info = subprocess.run(["go", "version", "-m", helm_binary], capture_output=True, text=True, check=True).stdout
    module = f"mod\t{pinned['HELM_MODULE']}\t{pinned['HELM_VERSION']}\t{pinned['HELM_MODULE_SUM']}"
    assert module in info, info[:500]
    assert "CGO_ENABLED=0" in info and "-trimpath=true" in info


def test_a_pin_that_does_not_match_stops_before_the_build(helm_binary, tmp_path):
    if shutil.which("go") is None:
        pytest.skip("go is not installed")
    tampered = tmp_path / "get-helm.sh"
    text = SCRIPT.read_text()
    good = pins()["HELM_MODULE_SUM"]
    tampered.write_text(text.replace(f"HELM_MODULE_SUM={good}", "HELM_MODULE_SUM=h1:" + "A" * 43 + "="))
    env = {k: v for k, v in os.environ.items() if k != "GPUZOMBIE_HELM"}
    got = subprocess.run(
        ["bash", str(tampered)],
        env={**env, "GPUZOMBIE_CACHE": str(tmp_path / "cache")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert got.returncode == 1 and got.stdout == ""
    assert "does not match its pinned go.sum hashes" in got.stderr, got.stderr
    assert "building" not in got.stderr and not (tmp_path / "cache").exists()


def test_a_helm_of_ones_own_is_used_as_is(helm_binary, tmp_path):
    env = {**os.environ, "GPUZOMBIE_HELM": helm_binary, "GPUZOMBIE_CACHE": str(tmp_path / "cache")}
    got = subprocess.run([str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert (got.returncode, got.stdout) == (0, f"{helm_binary}\n"), got.stderr
    broken = {**env, "GPUZOMBIE_HELM": str(tmp_path / "no-helm")}
    got = subprocess.run([str(SCRIPT)], env=broken, capture_output=True, text=True, timeout=60)
    assert got.returncode == 1 and "does not run" in got.stderr
