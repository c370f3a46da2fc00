"""The Gitea Actions workflows (GitHub Actions syntax): they parse and have the seed's jobs."""

from __future__ import annotations

import pathlib
import re

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML is in the 'chart' extra")

REPO = pathlib.Path(__file__).resolve().parents[2]
WORKFLOWS = REPO / ".gitea" / "workflows"
SECRETS = ("REGISTRY_URL", "REGISTRY_USER", "REGISTRY_PASSWORD")


def load(name: str) -> dict:
    workflow = yaml.safe_load((WORKFLOWS / name).read_text())
    # YAML 1.1 reads the key `on` as True.
    workflow["on"] = workflow.pop(True, workflow.get("on"))
    return workflow


def steps_text(job: dict) -> str:
    return yaml.safe_dump(job["steps"])


@pytest.mark.parametrize("name", ["ci.yaml", "cd.yaml"])
def test_workflow_parses_and_pins_every_action(name):
    workflow = load(name)
    assert workflow["jobs"] and workflow["on"]
    for job in workflow["jobs"].values():
        assert job["runs-on"]
        for step in job["steps"]:
            if "uses" in step:
                assert re.fullmatch(r"[\w.-]+/[\w.-]+@v\d+", step["uses"]), step["uses"]


def test_ci_runs_the_tests_then_builds_the_image_matrix_on_change():
    ci = load("ci.yaml")
    jobs = ci["jobs"]
    assert "make test" in steps_text(jobs["test"])
    filters = yaml.safe_load(jobs["changes"]["steps"][-1]["with"]["filters"])
    assert {"docker/**", "src/**"} <= set(filters["images"])
    images = jobs["images"]
    assert set(images["needs"]) == {"test", "changes"}
    assert "needs.changes.outputs.images == 'true'" in images["if"]
    matrix = images["strategy"]["matrix"]["include"]
    assert {m["image"] for m in matrix} >= {"nofix", "tini", "fullfix", "node"}
    assert {m["target"] for m in matrix} == {"nofix", "tini", "fullfix", "node"}
    assert {"image": "nofix-uid1000", "target": "nofix", "uid": "1000"} in matrix
    text = yaml.safe_dump(images)
    for secret in SECRETS:
        assert f"secrets.{secret}" in text
    build = next(s for s in images["steps"] if s.get("uses", "").startswith("docker/build-push-action"))
    assert build["with"]["file"] == "docker/Dockerfile"
    assert build["with"]["target"] == "${{ matrix.target }}"
    assert build["with"]["push"] is True


def test_cd_packages_and_pushes_the_charts_on_v_tags():
    cd = load("cd.yaml")
    assert cd["on"] == {"push": {"tags": ["v*"]}}
    job = cd["jobs"]["chart"]
    assert job["strategy"]["matrix"]["chart"] == ["gpuzombie", "gpu-zombie-test"]
    text = steps_text(job) + yaml.safe_dump(job.get("env", {}))
    assert "helm lint --strict" in text
    assert "helm package" in text and "helm push" in text
    assert "oci://" in text and "charts/${{ matrix.chart }}" in text
    for secret in SECRETS:
        assert f"secrets.{secret}" in text
    # The password reaches helm through stdin from an env var, never on a command line.
    assert "--password-stdin" in text and "${{ secrets.REGISTRY_PASSWORD }} |" not in text


def test_cd_pushes_the_node_image_the_gpuzombie_chart_names():
    """<registry>/<project>/gpuzombie-node:<tag version>: the chart's repository, tag = appVersion."""
    cd = load("cd.yaml")
    job = cd["jobs"]["node-image"]
    assert cd["jobs"]["chart"]["needs"] == ["node-image"]
    assert job["env"]["IMAGE"].endswith("/gpuzombie-node")
    build = next(s for s in job["steps"] if s.get("uses", "").startswith("docker/build-push-action"))
    assert build["with"]["target"] == "node" and build["with"]["push"] is True
    assert build["with"]["tags"].strip() == "${{ env.IMAGE }}:${{ steps.version.outputs.version }}"
    assert "--app-version" in steps_text(cd["jobs"]["chart"])  # the chart's appVersion is that version
