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


def _helm_line(section_heading: str, verb: str) -> list[str]:
    text = section(doc("README"), section_heading).replace("\\\n", " ")
    (line,) = [line for line in text.splitlines() if line.startswith(f"helm {verb} ")]
    return shlex.split(line, comments=True)


def _release(words: list[str]) -> tuple[str, str, list[str]]:
    """(release, namespace, the --set expressions) of a helm install/upgrade line."""
    namespace = next(words[i + 1] for i, w in enumerate(words) if w in ("-n", "--namespace"))
    sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
    return words[2], namespace, sets


def test_the_readme_webhook_line_upgrades_the_same_release(helm_binary):
    """Issue 26 (3): the webhook line made a second release (another namespace) with a second DaemonSet.
    Now it upgrades the install's release in place (--reuse-values: the install's values stay), and one
    release renders one node agent and the webhook, its init container from the same registry."""
    import yaml

    release, namespace, install_sets = _release(_helm_line("## On a cluster", "install"))
    upgrade = _helm_line("## Prevent it", "upgrade")
    assert "--install" not in upgrade and "--reuse-values" in upgrade
    assert _release(upgrade)[:2] == (release, namespace)
    sets = [*install_sets, *_release(upgrade)[2]]
    args = ["template", release, str(REPO / upgrade[3]), "-n", namespace]
    got = helm(helm_binary, *args, *[x for s in sets for x in ("--set", s)])
    assert got.returncode == 0, got.stderr
    objects = [o for o in yaml.safe_load_all(got.stdout) if o]
    assert [o["kind"] for o in objects].count("DaemonSet") == 1
    (webhook,) = [o for o in objects if o["kind"] == "Deployment"]
    command = webhook["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--image") + 1] == "REGISTRY/gpu-zombie/gpuzombie-node:0.1.0"
