"""The gpu-zombie-test chart, rendered and linted by Helm's own engine and validated strictly."""

from __future__ import annotations

import pathlib

import pytest

pytest.importorskip("helm_python", reason="helm-python-sdk is in the 'chart' extra")
pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the 'chart' extra")

from k8s_support import (
    CHART_DIR,
    DEFAULT_SCENARIOS,
    K8S_VERSIONS,
    NAMESPACE,
    SCENARIOS,
    container,
    helm,
    notes,
    only,
    pods_by_name,
    render,
    validate_strictly,
)

WARNING = 2  # helm lint severities: 1 info, 2 warning, 3 error


@pytest.mark.parametrize(
    "values",
    [None, only(None), only(None, node=True)] + [only(key) for key in SCENARIOS],
    ids=["defaults", "nothing", "node-only", *list(SCENARIOS)],
)
@pytest.mark.parametrize("kube_version", K8S_VERSIONS)
def test_lint_is_clean_in_strict_mode(values, kube_version):
    report = helm.lint(CHART_DIR, values, strict=True, namespace=NAMESPACE, kube_version=f"v{kube_version}")
    problems = [m for m in report["messages"] if m["severity"] >= WARNING]
    assert report["total_charts_linted"] == 1
    assert not problems and not report["errors"], report


def test_defaults_render_the_seed_four_pods_and_the_daemonset(default_objects):
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in default_objects.values())
    assert kinds == sorted(
        [("Pod", SCENARIOS[key][0]) for key in DEFAULT_SCENARIOS] + [("DaemonSet", "gpuzombie-node")]
    )
    for obj in default_objects.values():
        assert obj["metadata"]["namespace"] == NAMESPACE
        validate_strictly(obj)


@pytest.mark.parametrize("key", list(SCENARIOS))
def test_each_toggle_renders_exactly_its_pod(key):
    objects = render(only(key))
    pod_name, lab_scenario = SCENARIOS[key]
    assert list(pods_by_name(objects)) == [pod_name]
    pod = pods_by_name(objects)[pod_name]
    assert pod["metadata"]["labels"]["gpuzombie.dev/scenario"] == lab_scenario
    assert pod["metadata"]["labels"]["gpuzombie.io/scenario"] == lab_scenario  # the old domain, an alias
    validate_strictly(pod)


def test_all_toggles_off_render_nothing():
    assert render(only(None)) == {}


def test_scenario_pods_follow_the_seed_table(default_objects):
    pods = pods_by_name(default_objects)
    expected = {  # pod: (image tag, preStop, graceful worker)
        "gpu-zombie-nofix": ("nofix", False, False),
        "gpu-zombie-tini": ("tini", False, False),
        "gpu-zombie-tini-prestop": ("tini", True, False),
        "gpu-zombie-fullfix": ("fullfix", True, True),
    }
    for name, (tag, has_prestop, fixed) in expected.items():
        pod = pods[name]
        worker = container(pod)
        assert worker["image"].endswith(f"/gpu-zombie/gpu-zombie-test:{tag}")
        assert worker["imagePullPolicy"] == "Always"
        assert pod["spec"]["terminationGracePeriodSeconds"] == 30
        assert pod["spec"]["imagePullSecrets"] == [{"name": "registry-pull-secret"}]
        assert worker["resources"]["limits"]["nvidia.com/gpu"] == 1
        # args only: the image's ENTRYPOINT (tini, or nothing for nofix) stays PID 1.
        assert "command" not in worker
        shell, flag, script = worker["args"]
        assert (shell, flag) == ("sh", "-c")
        # sleep as PID 1 (S1): the parent in the background; tini: in the foreground, then sleep.
        assert script.endswith(" & exec sleep infinity" if tag == "nofix" else "; exec sleep infinity")
        assert ("--fixed" in script) is fixed
        if has_prestop:
            assert worker["lifecycle"]["preStop"]["exec"]["command"] == [
                "gpuzombie",
                "prestop",
                "--timeout",
                "20",
            ]
        else:
            assert "lifecycle" not in worker


def test_share_process_namespace_is_a_toggle():
    """S5 is S1's pod with the pause as PID 1; the toggle works on any scenario and is off by default."""
    pod = pods_by_name(render(only("sharePid")))["gpu-zombie-sharepid"]
    assert pod["spec"]["shareProcessNamespace"] is True
    assert container(pod)["image"].endswith(":nofix") and container(pod)["args"][2].endswith(" & exec sleep infinity")
    validate_strictly(pod)
    values = only("tini")
    values["scenarios"]["tini"]["shareProcessNamespace"] = True
    assert pods_by_name(render(values))["gpu-zombie-tini"]["spec"]["shareProcessNamespace"] is True
    assert all("shareProcessNamespace" not in p["spec"] for p in pods_by_name(render()).values())


def test_values_reach_every_pod():
    values = {
        "image": {"registry": "harbor.example.org", "repository": "aipf/gzt", "tagSuffix": "-abc1234"},
        "terminationGracePeriodSeconds": 45,
        "workload": {"workers": 10, "sizeMib": 512},
        "gpu": {"count": 2},
        "prestop": {"timeoutSeconds": 30},
        "nodeSelector": {"kubernetes.io/hostname": "gpu-4"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}],
        "runtimeClassName": "nvidia",
    }
    pods = pods_by_name(render(values))
    assert len(pods) == len(DEFAULT_SCENARIOS)
    for pod in pods.values():
        worker, spec = container(pod), pod["spec"]
        assert worker["image"].startswith("harbor.example.org/aipf/gzt:")
        assert worker["image"].endswith("-abc1234")
        assert spec["terminationGracePeriodSeconds"] == 45
        assert "--workers 10 --size-mib 512" in worker["args"][2]
        assert worker["resources"]["limits"]["nvidia.com/gpu"] == 2
        assert spec["nodeSelector"] == values["nodeSelector"]
        assert spec["tolerations"] == values["tolerations"]
        assert spec["runtimeClassName"] == "nvidia"
        if "lifecycle" in worker:
            assert worker["lifecycle"]["preStop"]["exec"]["command"][-1] == "30"
        validate_strictly(pod)


def test_prestop_timeout_must_end_before_the_grace_period():
    with pytest.raises(helm.HelmError, match=r"prestop\.timeoutSeconds must be below"):
        render({"prestop": {"timeoutSeconds": 30}})


def test_non_root_variant_runs_as_uid_1000():
    pod = pods_by_name(render(only("nofixUid1000")))["gpu-zombie-nofix-uid1000"]
    assert pod["spec"]["securityContext"] == {"runAsUser": 1000, "runAsGroup": 1000, "runAsNonRoot": True}
    assert container(pod)["image"].endswith(":nofix-uid1000")


def test_daemonset_is_least_privilege(default_objects):
    (ds,) = [o for o in default_objects.values() if o["kind"] == "DaemonSet"]
    pod_spec = ds["spec"]["template"]["spec"]
    trace = container(ds)
    security = trace["securityContext"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in trace["env"]}
    mounts = {m["name"]: m for m in trace["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec["volumes"]}

    assert pod_spec["hostPID"] is True
    assert pod_spec["automountServiceAccountToken"] is False
    assert security["privileged"] is False and security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["DAC_READ_SEARCH", "SYS_PTRACE"]}
    # Host /proc and the kubelet's pod-resources socket directory, both read-only.
    assert volumes["host-proc"]["hostPath"]["path"] == "/proc"
    assert mounts["host-proc"] == {"name": "host-proc", "mountPath": "/host/proc", "readOnly": True}
    assert env["GPUZOMBIE_PROCFS"] == "/host/proc"
    assert volumes["pod-resources"]["hostPath"]["path"] == "/var/lib/kubelet/pod-resources"
    assert mounts["pod-resources"]["readOnly"] is True
    # ... and its socket given to the tools: no GPU holder is called stale without the kubelet's pod list.
    assert env["GPUZOMBIE_POD_RESOURCES_SOCKET"] == "/var/lib/kubelet/pod-resources/kubelet.sock"
    # NVML through the NVIDIA runtime without taking a GPU away from the workloads.
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert "nvidia.com/gpu" not in str(trace["resources"])
    assert set(trace["resources"]) == {"requests", "limits"}
    assert trace["args"] == ["gpuzombie", "exporter", "--listen", "0.0.0.0:9400", "--min-interval", "15"]
    assert trace["ports"] == [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]
    annotations = ds["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "9400",
        "prometheus.io/path": "/metrics",
    }


def test_notes_list_each_enabled_pod_with_its_lab_scenario():
    text = notes()
    for key in DEFAULT_SCENARIOS:
        pod_name, lab_scenario = SCENARIOS[key]
        assert pod_name in text and lab_scenario in text
    assert "gpu-zombie-nofix-uid1000" not in text


def test_cri_socket_read_only_and_node_name_by_default(default_objects):
    (ds,) = [o for o in default_objects.values() if o["kind"] == "DaemonSet"]
    exporter = container(ds)
    assert {e["name"]: e.get("value") for e in exporter["env"]}[
        "GPUZOMBIE_CRI_SOCKET"
    ] == "/run/containerd/containerd.sock"
    node_name = next(e for e in exporter["env"] if e["name"] == "NODE_NAME")  # dcgm-exporter's Hostname
    assert node_name["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    mount = {"name": "cri-socket", "mountPath": "/run/containerd/containerd.sock", "readOnly": True}
    assert mount in exporter["volumeMounts"]
    volume = next(v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == "cri-socket")
    assert volume["hostPath"] == {"path": "/run/containerd/containerd.sock", "type": "Socket"}
    values = only(None, node=True)
    values["node"]["cri"] = {"enabled": True, "socket": "/run/crio/crio.sock"}
    (ds,) = render(values).values()
    assert {e["name"]: e.get("value") for e in container(ds)["env"]}["GPUZOMBIE_CRI_SOCKET"] == "/run/crio/crio.sock"
    validate_strictly(ds)
    values["node"]["cri"] = {"enabled": False}
    (ds,) = render(values).values()
    assert "cri-socket" not in str(ds) and "GPUZOMBIE_CRI_SOCKET" not in str(ds)


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"scenarios": {"nofx": {"enabled": True}}}, "additional properties 'nofx'"),
        ({"scenarios": {"tini": {"init": "dumb-init"}}}, "value must be one of"),
        ({"workload": {"workers": 0}}, "minimum"),
        ({"imagePullPolicy": "Always"}, "additional properties 'imagePullPolicy'"),
    ],
    ids=["typo-in-scenario", "unknown-init", "no-workers", "misplaced-key"],
)
def test_values_schema_rejects_mistakes(values, complaint):
    """values.schema.json: a typo fails the install instead of being silently ignored."""
    with pytest.raises(helm.HelmValuesError, match=complaint):
        render(values)


def test_cd_packaging_gives_a_chart_that_renders(tmp_path):
    """What cd.yaml does on tag v0.2.0: package with the tag's version; the archive still renders."""
    archive = helm.package(CHART_DIR, destination=tmp_path, version="0.2.0", app_version="0.2.0")
    assert pathlib.Path(archive).name == "gpu-zombie-test-0.2.0.tgz"
    with helm.Chart.load(archive) as chart:
        assert chart.version == "0.2.0"
        rendered = chart.render(None, name="gpu-zombie-test", namespace=NAMESPACE)
    assert sum("kind: Pod" in text for text in rendered.values()) == len(DEFAULT_SCENARIOS)
