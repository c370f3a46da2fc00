"""The README's cluster quick start is what the tests run: `make image` exists and names the image the
tag and push lines use, and its `helm install` renders, with the real helm, a DaemonSet on that image
plus the ServiceMonitor and PrometheusRule it asks for."""

from __future__ import annotations

import re
import shlex
import tomllib

from cluster_support import CHART, REPO, by_kind, helm

from docs import doc, section


def quick_start() -> str:
    text = section(doc("README"), "## On a cluster: the node agent")
    return text[text.index("```sh") + 5 : text.index("```", text.index("```sh") + 5)].strip()


def test_make_image_names_the_image_the_readme_tags():
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    chart_version = re.search(r'^appVersion: "?([^"\n]+)"?$', (CHART / "Chart.yaml").read_text(), re.M)
    assert chart_version and chart_version.group(1) == version
    assert re.search(r"^image:", (REPO / "Makefile").read_text(), re.M)
    lines = quick_start()
    assert lines.startswith("make image")
    assert (
        f"podman tag localhost/gpu-zombie/gpuzombie-node:{version} REGISTRY/gpu-zombie/gpuzombie-node:{version}"
        in lines
    )


def test_the_readme_helm_install_renders_with_the_real_helm(helm_binary):
    import yaml

    command = quick_start()
    install = shlex.split(command[command.index("helm install") :].replace("\\\n", " ").splitlines()[0])
    assert install[:4] == ["helm", "install", "gpuzombie", "charts/gpuzombie"]
    args = ["template", *install[2:]]
    args[2] = str(REPO / install[3])
    got = helm(helm_binary, *[a for a in args if a != "--create-namespace"])
    assert got.returncode == 0, got.stderr
    objects = by_kind([o for o in yaml.safe_load_all(got.stdout) if o])
    (container,) = objects["DaemonSet"]["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "REGISTRY/gpu-zombie/gpuzombie-node:0.1.0"
    assert {"ServiceMonitor", "PrometheusRule"} <= set(objects)
