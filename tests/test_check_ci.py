"""`gpuzombie check` in CI (issue 24 point 4), as a user runs it: `--disable`, the per-object
annotation `gpuzombie.dev/suppress` (kept and marked in JSON and SARIF, validated against the official
2.1.0 schema), `--fail-on`, and a directory with unreadable files that is still reported in full."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from test_check import SARIF_SCHEMA, gpuzombie, one_line_error

yaml = pytest.importorskip("yaml", reason="PyYAML is in the 'admission' extra")


def deployment(name: str, command: list[str] | None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A GPU Deployment whose one container runs ``command`` (None: the image's ENTRYPOINT)."""
    train: dict[str, Any] = {"name": "train", "image": "registry.example.com/ml/train:2.1"}
    if command is not None:
        train["command"] = command
    train["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    meta: dict[str, Any] = {"name": name, **({"annotations": annotations} if annotations else {})}
    template = {"metadata": {"labels": {"app": name}}, "spec": {"containers": [train]}}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": {"template": template}}


PLAIN = ["python", "train.py"]  # GZ002 (warning): a program as PID 1, no init
SHELL = ["sh", "-c", "python3 train.py & exec sleep infinity"]  # GZ001 (error)
DASH = ["sh", "-c", "python3 -m vllm.entrypoints.openai.api_server --model m"]  # GZ008 (error): dash stays PID 1


def write(directory: pathlib.Path, name: str, *objects: dict[str, Any]) -> pathlib.Path:
    path = directory / name
    path.write_text(yaml.safe_dump_all(objects, sort_keys=False))
    return path


def findings(report: dict[str, Any]) -> dict[tuple[str, str], tuple[bool, str | None]]:
    """(object name, rule) -> (suppressed, justification)."""
    return {
        (p["name"], f["rule"]): (f["suppressed"], f["justification"]) for p in report["pods"] for f in p["findings"]
    }


def test_disable_turns_a_rule_off_for_the_run(tmp_path):
    path = write(tmp_path, "d.yaml", deployment("plain", PLAIN), deployment("shell", SHELL))
    assert gpuzombie("check", str(path)).returncode == 1
    done = gpuzombie("check", "--json", "--disable", "GZ001", "--disable", "gz002", str(path))
    assert done.returncode == 0, done.stdout
    report = json.loads(done.stdout)
    assert findings(report) == {} and report["summary"]["disabled"] == ["GZ001", "GZ002"]
    assert gpuzombie("check", "--disable", "GZ001,GZ002", str(path)).returncode == 0  # comma-separated too
    assert "unknown rule GZ999" in one_line_error(gpuzombie("check", "--disable", "GZ999", str(path)))


def test_fail_on_sets_the_least_severity_that_fails():
    plain = yaml.safe_dump(deployment("plain", PLAIN))  # a warning
    assert gpuzombie("check", "-", stdin=plain).returncode == 0  # the default: only errors (certain waste) fail
    assert gpuzombie("check", "--fail-on", "warning", "-", stdin=plain).returncode == 1
    entrypoint = yaml.safe_dump(deployment("entrypoint", None))  # GZ006, a note
    assert gpuzombie("check", "-", stdin=entrypoint).returncode == 0
    assert gpuzombie("check", "--fail-on", "note", "-", stdin=entrypoint).returncode == 1
    shell = yaml.safe_dump(deployment("shell", SHELL))
    assert gpuzombie("check", "--fail-on", "error", "-", stdin=shell).returncode == 1
    assert gpuzombie("check", "-", stdin=shell).returncode == 1
    assert "'fatal' is not one of" in one_line_error(gpuzombie("check", "--fail-on", "fatal", "-", stdin=shell))


def test_the_certain_case_has_its_own_rule_and_fails_by_default_the_possible_one_does_not():
    """Issue 35 (2): `sh -c 'python3 -m vllm …'` (dash stays PID 1, drops SIGTERM: the whole grace,
    certain) got the same GZ002 warning as `python3 -m vllm` (which handles SIGTERM itself), and the
    default --fail-on warning failed both, so teams would `--disable GZ002` and lose the dash case."""
    both = yaml.safe_dump_all([deployment("dash", DASH), deployment("vllm", ["python3", *DASH[2].split()[1:]])])
    done = gpuzombie("check", "--json", "-", stdin=both)
    assert done.returncode == 1, done.stdout  # the default fails on the certain one
    report = json.loads(done.stdout)
    levels = {(p["name"], f["rule"], f["severity"]) for p in report["pods"] for f in p["findings"]}
    assert levels == {("dash", "GZ008", "error"), ("vllm", "GZ002", "warning")}
    assert report["summary"]["fail_on"] == "error" and report["rules"]["GZ008"]["name"] == "pid1-drops-sigterm"
    off = gpuzombie("check", "--disable", "GZ002", "-", stdin=both)  # GZ002 off: the dash case still fails
    assert off.returncode == 1 and "GZ008" in off.stdout
    sarif = json.loads(gpuzombie("check", "--sarif", "-", stdin=both).stdout)["runs"][0]
    assert {(r["ruleId"], r["level"]) for r in sarif["results"]} == {("GZ008", "error"), ("GZ002", "warning")}


def test_the_suppress_annotation_keeps_the_finding_marked_with_its_reason(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    reaps = "the trainer reaps its own children"
    on_object = deployment("plain", PLAIN, {"gpuzombie.dev/suppress": f"GZ002: {reaps}"})
    on_template = deployment("shell", SHELL)
    on_template["spec"]["template"]["metadata"]["annotations"] = {
        "gpuzombie.dev/suppress": "GZ005: n/a\nGZ001, GZ006: reviewed in PR 42, the worker exits on SIGTERM"
    }
    other = deployment("other", SHELL, {"gpuzombie.dev/suppress": "GZ002: not this rule"})
    path = write(tmp_path, "d.yaml", on_object, on_template, other)
    done = gpuzombie("check", "--json", str(path))
    assert done.returncode == 1  # `other` still has its GZ001
    report = json.loads(done.stdout)
    assert findings(report) == {
        ("plain", "GZ002"): (True, reaps),
        ("shell", "GZ001"): (True, "reviewed in PR 42, the worker exits on SIGTERM"),
        ("other", "GZ001"): (False, None),
    }
    assert report["summary"]["findings"] == 1 and report["summary"]["suppressed"] == 2
    table = gpuzombie("check", str(path))
    assert "2 suppressed by annotation" in table.stdout and table.stdout.count("GZ001") == 2  # row + legend

    sarif = json.loads(gpuzombie("check", "--sarif", "--disable", "GZ003", str(path)).stdout)
    errors = sorted(jsonschema.Draft4Validator(json.loads(SARIF_SCHEMA.read_text())).iter_errors(sarif), key=str)
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors]
    run = sarif["runs"][0]
    marked = {r["message"]["text"].split(",")[0]: r.get("suppressions") for r in run["results"]}
    assert marked == {
        "Deployment/plain": [{"kind": "inSource", "status": "accepted", "justification": reaps}],
        "Deployment/shell": [
            {
                "kind": "inSource",
                "status": "accepted",
                "justification": "reviewed in PR 42, the worker exits on SIGTERM",
            }
        ],
        "Deployment/other": None,
    }
    (override,) = run["invocations"][0]["ruleConfigurationOverrides"]
    assert override["descriptor"]["id"] == "GZ003" and override["configuration"] == {"enabled": False}
    assert run["invocations"][0]["executionSuccessful"] is True


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("GZ002", "each entry is 'GZ00x: reason'"),
        ("GZ002:   ", "each entry is 'GZ00x: reason'"),
        ("GZ042: why", "unknown rule 'GZ042'"),
    ],
)
def test_a_suppression_without_a_reason_or_rule_is_refused_naming_the_object(value, message):
    done = gpuzombie("check", "-", stdin=yaml.safe_dump(deployment("plain", PLAIN, {"gpuzombie.dev/suppress": value})))
    shown = one_line_error(done)
    assert message in shown and "Deployment/plain" in shown and "gpuzombie.dev/suppress" in shown


def test_a_directory_with_unreadable_files_reports_every_other_file_and_exits_2(tmp_path):
    for i in range(5):
        write(tmp_path, f"ok-{i}.yaml", deployment(f"train-{i}", SHELL))
    (tmp_path / "latin1.yaml").write_bytes(b"kind: Pod\nmetadata: {name: caf\xe9}\n")  # not UTF-8
    (tmp_path / "broken.yaml").write_text("kind: Pod\nspec: [\n")  # not YAML
    done = gpuzombie("check", "--json", str(tmp_path))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    report = json.loads(done.stdout)
    assert sorted(p["name"] for p in report["pods"]) == [f"train-{i}" for i in range(5)]
    assert report["summary"]["findings"] == 5 and report["summary"]["unreadable"] == 2
    assert sorted(pathlib.Path(e["file"]).name for e in report["errors"]) == ["broken.yaml", "latin1.yaml"]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 2 and "cannot read" in lines[1] and "not YAML" in lines[0], lines
    table = gpuzombie("check", str(tmp_path))
    assert table.returncode == 2 and "2 input(s) not read (exit 2)" in table.stdout
    sarif = json.loads(gpuzombie("check", "--sarif", str(tmp_path)).stdout)
    invocation = sarif["runs"][0]["invocations"][0]
    assert invocation["executionSuccessful"] is False and len(invocation["toolExecutionNotifications"]) == 2
    assert len(sarif["runs"][0]["results"]) == 5
