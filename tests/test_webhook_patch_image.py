"""`webhook --patch` on a manifest with `command` (issue 35 (1)): every real manifest with a `command`
needs the init container's image. Before, `--patch` without `--image` exited 2 ("give its image with
--image …") and the README showed only a pod without `command`. Now a printed `--patch` takes the
chart's default image and says so; `--in-place` and serving still need it named."""

from __future__ import annotations

import subprocess
import sys

import pytest

yaml = pytest.importorskip("yaml", reason="the admission extra (PyYAML)")
pytest.importorskip("ruamel.yaml", reason="the admission extra (ruamel.yaml)")

from gpuzombie import __version__  # noqa: E402
from gpuzombie.admission.mutate import DEFAULT_IMAGE  # noqa: E402
from test_check import REPO, gpuzombie, one_line_error  # noqa: E402

WITH_COMMAND = REPO / "tests" / "fixtures" / "labpod" / "pod-nofix-command.yaml"
VLLM = REPO / "tests" / "fixtures" / "gitops" / "kubernetes-examples_vllm-deployment.yaml"


def _install(doc: dict) -> dict:
    spec = doc["spec"]["template"]["spec"] if doc["kind"] == "Deployment" else doc["spec"]
    (install,) = [c for c in spec["initContainers"] if c["name"] == "gpuzombie-install"]
    return install


def test_the_chart_default_is_the_charts_own_image_reference():
    chart = (REPO / "charts" / "gpuzombie" / "Chart.yaml").read_text()
    values = yaml.safe_load((REPO / "charts" / "gpuzombie" / "values.yaml").read_text())["image"]
    app_version = yaml.safe_load(chart)["appVersion"]
    assert f"{values['registry']}/{values['repository']}:{values['tag'] or app_version}" == DEFAULT_IMAGE
    assert app_version == __version__


@pytest.mark.parametrize("manifest", [WITH_COMMAND, VLLM], ids=["pod", "vllm deployment"])
def test_a_printed_patch_of_a_manifest_with_command_works_and_says_which_image(manifest):
    done = gpuzombie("webhook", "--patch", str(manifest))
    assert done.returncode == 0, done.stderr
    doc = yaml.safe_load(done.stdout)
    assert _install(doc)["image"] == DEFAULT_IMAGE
    assert f"the init container's image is {DEFAULT_IMAGE}, the chart's default" in done.stderr
    assert f"--image REGISTRY/gpu-zombie/gpuzombie-node:{__version__}" in done.stderr


def test_the_working_form_names_the_registrys_image_and_says_nothing_of_a_default():
    image = f"REGISTRY/gpu-zombie/gpuzombie-node:{__version__}"
    done = gpuzombie("webhook", "--patch", str(WITH_COMMAND), "--image", image)
    assert done.returncode == 0 and "chart's default" not in done.stderr
    install = _install(yaml.safe_load(done.stdout))
    assert install["image"] == image and install["command"][0] == "cp"


def test_a_patch_that_needs_no_image_says_nothing_of_one():
    done = gpuzombie("webhook", "--patch", str(REPO / "deploy" / "pod-nofix.yaml"))
    assert done.returncode == 0 and "chart's default" not in done.stderr
    assert yaml.safe_load(done.stdout)["spec"]["shareProcessNamespace"] is True


def test_in_place_still_needs_the_image_named_and_writes_nothing_without_it(tmp_path):
    copy = tmp_path / "pod.yaml"
    copy.write_text(WITH_COMMAND.read_text())
    refused = gpuzombie("webhook", "--patch", str(copy), "--in-place")
    line = one_line_error(refused)
    assert refused.returncode == 2 and "--in-place writes into the file" in line
    assert f"--image REGISTRY/gpu-zombie/gpuzombie-node:{__version__}" in line
    assert copy.read_text() == WITH_COMMAND.read_text()
    image = "registry.example.com/gpu-zombie/gpuzombie-node:0.1.0"
    assert gpuzombie("webhook", "--patch", str(copy), "--in-place", "--image", image).returncode == 0
    assert _install(yaml.safe_load(copy.read_text()))["image"] == image


def test_help_shows_the_working_form():
    done = subprocess.run(
        [sys.executable, "-m", "gpuzombie", "webhook", "--help"], capture_output=True, text=True, timeout=60
    )
    text = " ".join(done.stdout.split())
    assert "gpuzombie webhook --patch FILE \\ --image REGISTRY/gpu-zombie/gpuzombie-node:VERSION" in text
    assert "a printed --patch without it takes the chart's default" in text


def test_the_readme_shows_the_working_form_and_it_runs():
    from docs import doc, section

    shown = section(doc("README"), "## Prevent it")
    (line,) = [x for x in shown.splitlines() if x.startswith(".venv/bin/gpuzombie webhook --patch") and "--image" in x]
    argv = line.split("#")[0].split()[1:]
    done = subprocess.run([sys.executable, "-m", "gpuzombie", *argv], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert _install(yaml.safe_load(done.stdout))["image"].startswith("REGISTRY/gpu-zombie/gpuzombie-node:")


def test_the_quick_start_of_admission_md_names_the_image_where_the_fix_needs_it():
    from docs import doc

    block = doc("admission").split("```sh\n", 1)[1].split("```", 1)[0]
    patches = [x for x in block.splitlines() if "--patch" in x]
    assert patches and all("--image REGISTRY/" in x or "pod-nofix.yaml" in x for x in patches), patches
