"""`gpuzombie check` and `gpuzombie webhook --patch` as a user runs them (real processes, stdin
pipes): every kind with a pod template, exit codes, the JSON schema, SARIF validated against the
official 2.1.0 schema, and the patched manifests checked clean and validated strictly."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from typing import Any

import pytest

from admission_support import validate_pod

yaml = pytest.importorskip("yaml", reason="PyYAML is in the 'admission' extra")

REPO = pathlib.Path(__file__).resolve().parents[1]
SARIF_SCHEMA = pathlib.Path(__file__).resolve().parent / "schemas" / "sarif-schema-2.1.0.json"

S1 = ["sh", "-c", "python3 train.py & exec sleep infinity"]


def template() -> dict[str, Any]:
    train = {"name": "train", "image": "registry.example.com/ml/train:2.1", "command": S1}
    train["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    return {"metadata": {"labels": {"app": "train"}}, "spec": {"containers": [train]}}


SELECTOR = {"matchLabels": {"app": "train"}}
OBJECTS: list[tuple[str, dict[str, Any]]] = [
    (
        "training/templates/deployment.yaml",
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "train", "namespace": "ml"},
            "spec": {"selector": SELECTOR, "template": template()},
        },
    ),
    (
        "training/templates/service.yaml",
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "train"}, "spec": {"ports": [{"port": 80}]}},
    ),
    (
        "training/templates/cronjob.yaml",
        {
            "apiVersion": "batch/v1",
            "kind": "CronJob",
            "metadata": {"name": "nightly"},
            "spec": {"schedule": "0 3 * * *", "jobTemplate": {"spec": {"template": template()}}},
        },
    ),
    (
        "training/templates/list.yaml",
        {
            "apiVersion": "v1",
            "kind": "List",
            "items": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "StatefulSet",
                    "metadata": {"name": "ss"},
                    "spec": {"serviceName": "ss", "selector": SELECTOR, "template": template()},
                },
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {"name": "once"},
                    "spec": {"template": template()},
                },
            ],
        },
    ),
    (
        "training/templates/quiet.yaml",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"generateName": "quiet-"},
            "spec": {"containers": [{"name": "web", "image": "nginx"}]},
        },
    ),
]
# As `helm template` prints it: a "# Source:" comment per document, and an empty document.
EVERY_KIND = "---\n".join(f"# Source: {src}\n" + yaml.safe_dump(obj, sort_keys=False) for src, obj in OBJECTS) + "---\n"


def gpuzombie(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuzombie", *args], input=stdin, capture_output=True, text=True, timeout=60
    )


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    return done.stderr


def test_every_kind_with_a_pod_template(tmp_path):
    path = tmp_path / "all.yaml"
    path.write_text(EVERY_KIND)
    done = gpuzombie("check", "--json", str(path))
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["schema"] == "gpuzombie.check/1"
    found = {(p["kind"], p["name"], p["pointer"]): [f["rule"] for f in p["findings"]] for p in report["pods"]}
    assert found == {
        ("Deployment", "train", "/spec/template"): ["GZ001"],
        ("CronJob", "nightly", "/spec/jobTemplate/spec/template"): ["GZ001"],
        ("StatefulSet", "ss", "/items/0/spec/template"): ["GZ001"],
        ("Job", "once", "/items/1/spec/template"): ["GZ001"],
        ("Pod", "quiet-", ""): [],
    }
    assert report["summary"] == {
        "pods": 5,
        "gpu_pods": 4,
        "findings": 4,
        "by_severity": {"error": 4, "warning": 0, "note": 0},
        "suppressed": 0,
        "disabled": [],
        "fail_on": "error",
        "unreadable": 0,
        "failed": True,
    }
    deployment = report["pods"][0]
    lines = EVERY_KIND.splitlines()
    assert deployment["namespace"] == "ml" and lines[deployment["line"] - 1] == "    spec:"  # the template's
    finding = deployment["findings"][0]
    assert "30.13 s" in finding["evidence"] and finding["fix"]
    assert lines[finding["line"] - 1].strip() == "- name: train"


def test_the_seed_pods_and_the_table():
    done = gpuzombie("check", str(REPO / "deploy" / "pod-nofix.yaml"))
    assert done.returncode == 0  # S1's pattern in args: a warning (possible: PID 1 cannot be told), shown
    assert "cannot tell PID 1" in done.stdout and "GZ001" in done.stdout and "30.13 s" in done.stdout
    assert gpuzombie("check", "--fail-on", "warning", str(REPO / "deploy" / "pod-nofix.yaml")).returncode == 1
    clean = gpuzombie("check", str(REPO / "deploy" / "pod-tini.yaml"))
    assert clean.returncode == 0, clean.stdout  # a note (cannot tell) is advice
    assert "GZ006" in clean.stdout


def test_a_time_sliced_gpu_is_a_gpu():
    """``nvidia.com/gpu.shared`` (the device plugin's time-slicing with renameByDefault) is a GPU to
    check as to the node agent: one recognition, k8s.podspec.gpus.gpu_resource (before: 0 with GPUs)."""
    text = (
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: c\n"
        "    command: [sh, -c, 'python3 train.py & sleep infinity']\n"
        "    resources: {limits: {nvidia.com/gpu.shared: 1}}\n"
    )
    done = gpuzombie("check", "--json", "-", stdin=text)
    assert done.returncode == 1 and json.loads(done.stdout)["summary"]["gpu_pods"] == 1, done.stdout


def test_clean_and_non_gpu_inputs_exit_0():
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "ok"},
        "spec": {
            "containers": [
                {
                    "name": "t",
                    "image": "i",
                    "command": ["tini", "--", "python3"],
                    "resources": {"limits": {"amd.com/gpu": 1}},
                }
            ]
        },
    }
    done = gpuzombie("check", "-", stdin=json.dumps(pod))
    assert done.returncode == 0 and "0 finding(s)" in done.stdout
    assert gpuzombie("check", "-", stdin="apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n").returncode == 0


@pytest.mark.parametrize(
    ("stdin", "message"),
    [
        ("kind: Pod\nspec: [unclosed\n", "stdin: not YAML or JSON at line"),
        ("kind: Pod\nspec: {containers: nope}\n", "spec.containers is not a list"),
        ("kind: Pod\nspec: {containers: [{name: t, command: [1, 2]}]}\n", "holds something other than strings"),
        ("[" * 100000, "stdin:"),
    ],
)
def test_unreadable_input_is_one_line_and_exit_2(stdin, message):
    assert message in one_line_error(gpuzombie("check", "-", stdin=stdin))


def test_a_missing_file_is_one_line_and_exit_2(tmp_path):
    assert "cannot read" in one_line_error(gpuzombie("check", str(tmp_path / "nope.yaml")))
    assert "exclusive" in one_line_error(gpuzombie("check", "--json", "--sarif", str(tmp_path)))


def test_sarif_is_valid_sarif_2_1_0(tmp_path):
    jsonschema = pytest.importorskip("jsonschema")
    (tmp_path / "all.yaml").write_text(EVERY_KIND)
    (tmp_path / "nested").mkdir()
    (tmp_path / "nested" / "pod.json").write_text((REPO / "deploy" / "pod-nofix.yaml").read_text())
    done = gpuzombie("check", "--sarif", str(tmp_path))
    assert done.returncode == 1, done.stderr
    sarif = json.loads(done.stdout)
    schema = json.loads(SARIF_SCHEMA.read_text())
    errors = sorted(jsonschema.Draft4Validator(schema).iter_errors(sarif), key=str)
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors]
    run = sarif["runs"][0]
    assert {r["ruleId"] for r in run["results"]} == {"GZ001"}
    rules = run["tool"]["driver"]["rules"]
    assert all(rules[r["ruleIndex"]]["id"] == r["ruleId"] for r in run["results"])
    regions = [r["locations"][0]["physicalLocation"] for r in run["results"]]
    assert {p["artifactLocation"]["uri"] for p in regions} == {
        str(tmp_path / "all.yaml"),
        str(tmp_path / "nested/pod.json"),
    }
    for p in regions:  # each at its container's line
        lines = pathlib.Path(p["artifactLocation"]["uri"]).read_text().splitlines()
        assert lines[p["region"]["startLine"] - 1].strip().startswith(("- name: train", "- name: worker")), p


def test_patch_fixes_templates_in_place_keeps_other_documents_and_checks_clean(tmp_path):
    path = tmp_path / "all.yaml"
    path.write_text(EVERY_KIND)
    done = gpuzombie("webhook", "--patch", str(path), "--image", "registry.example.com/gpuzombie-node:0.1.0")
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d is not None]  # the input's empty last document stays
    assert [d["kind"] for d in docs] == ["Deployment", "Service", "CronJob", "List", "Pod"]
    sources = [line for line in EVERY_KIND.splitlines() if line.startswith("# Source:")]
    assert [line for line in done.stdout.splitlines() if line.startswith("# Source:")] == sources
    template = docs[0]["spec"]["template"]
    assert template["metadata"]["annotations"]["gpuzombie.dev/injected"] == "tini:train"
    assert template["spec"]["containers"][0]["command"][:4] == ["/.gpuzombie/tini-static", "-s", "-g", "--"]
    assert docs[1] == OBJECTS[1][1]
    assert docs[3]["items"][1]["spec"]["template"]["spec"]["initContainers"][0]["name"] == "gpuzombie-install"
    for doc in (docs[0], docs[2], *docs[3]["items"]):
        validate_pod(doc)  # Deployment, CronJob, StatefulSet, Job: strict, 1.29 and the newest
    assert "run container train's command under tini" in done.stderr
    again = gpuzombie("check", "-", stdin=done.stdout)
    assert again.returncode == 0, again.stdout
    twice = gpuzombie("webhook", "--patch", "-", stdin=done.stdout)
    assert twice.stdout == done.stdout  # idempotent, byte for byte


def test_patch_of_the_seed_pod_shares_the_process_namespace():
    done = gpuzombie("webhook", "--patch", str(REPO / "deploy" / "pod-nofix.yaml"))
    assert done.returncode == 0, done.stderr
    pod = yaml.safe_load(done.stdout)
    assert pod["spec"]["shareProcessNamespace"] is True
    assert pod["spec"]["containers"][0]["args"][2].endswith("& exec sleep infinity")  # not rewritten
    assert "no registry lookup" in done.stderr
    validate_pod(pod)


def test_patch_refuses_bad_input_in_one_line():
    assert "not YAML" in one_line_error(gpuzombie("webhook", "--patch", "-", stdin="a: [b\n"))
    assert "NAMESPACE:KEY=VALUE" in one_line_error(gpuzombie("webhook", "--patch", "-", "--opt-in", "ml:x=1"))


def test_the_readmes_prevent_it_commands_run_as_shown():
    from docs import doc, section

    shown = section(doc("README"), "## Prevent it")
    venv_cli = ".venv/bin/gpuzombie "  # the README's commands run the project venv's entry point
    commands = [
        line.split("#")[0].split()[1:] for line in shown.splitlines() if line.startswith(venv_cli) and "|" not in line
    ]
    assert [c[:1] for c in commands] == [["check"], ["webhook"], ["webhook"]]
    cli = [sys.executable, "-m", "gpuzombie"]
    check = subprocess.run([*cli, *commands[0]], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert check.returncode == 0  # GZ001 without command is a warning: possible (the ENTRYPOINT may be an init)
    assert "GZ001" in check.stdout and "deploy/pod-nofix.yaml" in check.stdout
    patch = subprocess.run([*cli, *commands[1]], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert patch.returncode == 0 and yaml.safe_load(patch.stdout)["spec"]["shareProcessNamespace"] is True


@pytest.mark.parametrize("argv", [["check", "deploy/pod-nofix.yaml"], ["webhook", "--patch", "deploy/pod-nofix.yaml"]])
def test_without_the_admission_extra_one_line_says_what_to_install(argv):
    probe = f"import sys; sys.modules['yaml'] = None\nfrom gpuzombie.cli.main import main\nsys.exit(main({argv!r}))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert ".venv/bin/pip install -e '.[admission]'" in one_line_error(done)
