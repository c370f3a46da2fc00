"""The Pod manifest subset of `gpuzombie lab pod`, parsed from fixture strings and from the real
webhook's output (``gpuzombie webhook --patch``): what is applied, what is accepted without effect
(listed), and the one-line refusal naming any other field."""

from __future__ import annotations

import pytest

pytest.importorskip("yaml", reason="PyYAML is in the 'labpod' extra")


import yaml

from gpuzombie.cli.main import main
from gpuzombie.lab.manifest import ManifestError, PodManifest, parse_pod, parse_quantity, pick_pod
from webhook_output import ROOT, UNPATCHED, webhook_patch


def pod(text: str) -> dict:
    return yaml.safe_load(text)


BASE = """
apiVersion: v1
kind: Pod
metadata: {name: p, namespace: ns}
spec:
  containers:
  - name: c
    image: example/any:1
    args: [sh, -c, "sleep 1"]
"""


def with_spec(**spec: object) -> dict:
    doc = pod(BASE)
    doc["spec"].update(spec)
    return doc


def test_pod_nofix_parses_with_its_grace_gpu_and_no_effect_fields():
    m = parse_pod(pick_pod(list(yaml.safe_load_all((ROOT / "deploy/pod-nofix.yaml").read_text()))))
    (c,) = m.containers
    assert m.name == "gpu-zombie-nofix" and m.namespace == "gpu-zombie-test" and m.grace_s == 30
    assert c.argv[:2] == ("sh", "-c") and not c.command_given  # args only: the ENTRYPOINT is empty
    assert c.resources.gpus == 1 and c.resources.memory_limit == 8 * 2**30 and c.resources.cpu_request == 0.25
    assert m.qos == "burstable" and not m.share_process_namespace
    assert m.no_effect == ("metadata.labels", "spec.imagePullSecrets", "spec.containers[0].imagePullPolicy")


def parse_text(text: str) -> PodManifest:
    return parse_pod(pick_pod(list(yaml.safe_load_all(text))))


def test_the_webhooks_tini_patch_is_applied_field_by_field():
    m = parse_text(webhook_patch(UNPATCHED["pod-nofix-command-prestop"].read_text()))
    (init,), (c,) = m.init_containers, m.containers
    assert init.name == "gpuzombie-install" and init.resources.cpu_limit == 0.1
    assert init.argv == ("cp", "/usr/bin/tini-static", "/opt/gpuzombie/prestop.pyz", "/.gpuzombie/")
    assert init.security.run_as_user == 65532 and init.security.run_as_non_root and init.security.read_only_root
    assert init.security.no_new_privs and init.security.drop_capabilities == ("ALL",)
    assert init.security.seccomp == "RuntimeDefault" and c.security.seccomp == "RuntimeDefault"  # the lab's default
    assert [(x.volume, x.path, x.read_only) for x in init.mounts] == [("gpuzombie-bin", "/.gpuzombie", False)]
    assert c.argv[:5] == ("/.gpuzombie/tini-static", "-s", "-g", "--", "sh") and c.command_given
    assert c.prestop is not None and c.prestop.command[:4] == ("python3", "-S", "-I", "/.gpuzombie/prestop.pyz")
    (vol,) = m.volumes
    assert vol.kind == "emptyDir" and vol.memory and vol.size_limit == 16 * 2**20
    assert m.annotations["gpuzombie.dev/injected"] == "tini:worker,prestop:worker"


@pytest.mark.parametrize("name", sorted(UNPATCHED))
def test_every_field_the_webhook_adds_is_applied(name):
    """lab pod runs the webhook's patch as a node would: of what --patch adds, only the init
    container's pull policy and the record annotation are merely listed, and nothing is refused."""
    source = UNPATCHED[name].read_text()
    added = set(parse_text(webhook_patch(source)).no_effect) - set(parse_text(source).no_effect)
    assert added <= {"metadata.annotations", "spec.initContainers[0].imagePullPolicy"}, added


def test_pod_security_context_is_inherited_and_a_container_overrides_it():
    doc = with_spec(
        securityContext={
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        }
    )
    doc["spec"]["containers"].append(
        {
            "name": "d",
            "image": "x",
            "command": ["true"],
            "securityContext": {"runAsUser": 7, "seccompProfile": {"type": "Unconfined"}},
        }
    )
    m = parse_pod(doc)
    assert [
        (c.security.run_as_user, c.security.run_as_group, c.security.run_as_non_root, c.security.seccomp)
        for c in m.containers
    ] == [(1000, 1000, True, "RuntimeDefault"), (7, 1000, True, "Unconfined")]
    assert m.no_effect == ()


def test_prestop_sleep_volumes_and_env():
    doc = with_spec(
        volumes=[{"name": "h", "hostPath": {"path": "/tmp", "type": "Directory"}}, {"name": "e", "emptyDir": {}}],
        terminationGracePeriodSeconds=3,
        shareProcessNamespace=True,
    )
    doc["spec"]["containers"][0].update(
        env=[{"name": "A", "value": "1"}],
        volumeMounts=[{"name": "h", "mountPath": "/h", "readOnly": True}, {"name": "e", "mountPath": "/e"}],
        lifecycle={"preStop": {"sleep": {"seconds": 2}}},
    )
    m = parse_pod(doc)
    c = m.containers[0]
    assert m.grace_s == 3 and m.share_process_namespace and c.env == (("A", "1"),)
    assert c.prestop is not None and c.prestop.sleep_s == 2 and not c.prestop.command
    assert [(v.kind, v.host_path, v.memory) for v in m.volumes] == [
        ("hostPath", "/tmp", False),
        ("emptyDir", None, False),
    ]
    assert m.qos == "besteffort"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda d: d["spec"].update(hostPID=True), "spec.hostPID"),
        (lambda d: d["spec"]["containers"][0].update(workingDir="/w"), "spec.containers[0].workingDir"),
        (
            lambda d: d["spec"]["containers"][0].update(env=[{"name": "A", "valueFrom": {"fieldRef": {}}}]),
            "spec.containers[0].env[0].valueFrom",
        ),
        (
            lambda d: d["spec"]["containers"][0].update(lifecycle={"postStart": {"exec": {"command": ["x"]}}}),
            "spec.containers[0].lifecycle.postStart",
        ),
        (
            lambda d: d["spec"]["containers"][0].update(lifecycle={"preStop": {"httpGet": {"port": 80}}}),
            "spec.containers[0].lifecycle.preStop.httpGet",
        ),
        (lambda d: d["spec"].update(volumes=[{"name": "s", "secret": {"secretName": "x"}}]), "spec.volumes[0].secret"),
        (
            lambda d: d["spec"]["containers"][0].update(resources={"limits": {"amd.com/gpu": 1}}),
            "spec.containers[0].resources.limits.amd.com/gpu",
        ),
        (
            lambda d: d["spec"]["containers"][0].update(securityContext={"privileged": True}),
            "spec.containers[0].securityContext.privileged",
        ),
        (
            lambda d: d["spec"]["containers"][0].update(securityContext={"capabilities": {"add": ["SYS_ADMIN"]}}),
            "spec.containers[0].securityContext.capabilities.add",
        ),
        (
            lambda d: d["spec"]["containers"][0].update(
                securityContext={"seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"}}
            ),
            "spec.containers[0].securityContext.seccompProfile.localhostProfile",
        ),
        (
            lambda d: d["spec"].update(securityContext={"seccompProfile": {"type": "Localhost"}}),
            "spec.securityContext.seccompProfile.type: 'Localhost' not supported",
        ),
        (lambda d: d["spec"]["containers"][0].pop("args"), "spec.containers[0]: neither command nor args"),
        (lambda d: d.update(kind="Deployment", apiVersion="apps/v1"), "runs a v1 Pod, not apps/v1/Deployment"),
    ],
)
def test_a_field_it_cannot_apply_is_refused_by_name(change, field):
    doc = pod(BASE)
    change(doc)
    with pytest.raises(ManifestError) as raised:
        parse_pod(doc)
    message = str(raised.value)
    assert message.startswith(field) or (field.startswith("runs") and field in message), message


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d["metadata"].update(name="../../etc"), "metadata.name: '../../etc' is not a DNS-1123 subdomain"),
        (lambda d: d["metadata"].update(name="a" * 254), "metadata.name: 'aaaa"),
        (lambda d: d["metadata"].update(name="Upper"), "metadata.name: 'Upper' is not a DNS-1123 subdomain"),
        (lambda d: d["metadata"].update(namespace="../x"), "metadata.namespace: '../x' is not a DNS-1123 label"),
        (lambda d: d["metadata"].update(namespace="a.b"), "metadata.namespace: 'a.b' is not a DNS-1123 label"),
        (
            lambda d: (d["metadata"].pop("name"), d["metadata"].update(generateName="../")),
            "metadata.generateName: '../lab' is not a DNS-1123 subdomain",
        ),
        (lambda d: d["spec"]["containers"][0].update(name="../c"), "spec.containers[0].name: '../c' is not a DNS"),
        (lambda d: d["spec"]["containers"][0].update(name="c" * 64), "spec.containers[0].name: 'ccc"),
        (lambda d: d["spec"]["containers"][0].pop("name"), "spec.containers[0].name: None is not a DNS-1123 label"),
        (
            lambda d: d["spec"].update(volumes=[{"name": "../../x", "emptyDir": {}}]),
            "spec.volumes[0].name: '../../x' is not a DNS-1123 label",
        ),
    ],
)
def test_names_follow_the_api_servers_rules(change, message):
    """Names become paths (log directory, log file, emptyDir directory): refused as the API server
    refuses them, before anything is made."""
    doc = pod(BASE)
    change(doc)
    with pytest.raises(ManifestError) as raised:
        parse_pod(doc)
    assert str(raised.value).startswith(message), raised.value


def test_names_the_api_server_takes_pass():
    doc = pod(BASE)
    doc["metadata"].update(name="a-1.b" + "c" * 240, namespace="n" * 63)
    doc["spec"]["containers"][0]["name"] = "c" * 63
    m = parse_pod(doc)
    assert m.name.startswith("a-1.b") and m.namespace == "n" * 63 and m.containers[0].name == "c" * 63


def test_quantities():
    assert parse_quantity("2Gi", "x") == 2 * 2**30 and parse_quantity("250m", "x") == 0.25
    assert parse_quantity(1, "x") == 1 and parse_quantity("1.5", "x") == 1.5 and parse_quantity("16M", "x") == 16e6
    with pytest.raises(ManifestError, match="x: '2 GB' is not a quantity"):
        parse_quantity("2 GB", "x")


def test_one_pod_per_input():
    assert pick_pod([None, {"kind": "List", "items": [{"kind": "Pod"}]}]) == {"kind": "Pod"}
    with pytest.raises(ManifestError, match="runs one Pod, the input has 2 objects"):
        pick_pod([{"kind": "Pod"}, {"kind": "Pod"}])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("spec: [unclosed", "not YAML or JSON at line"),
        (BASE.replace("args:", "workingDir: /x\n    args:"), "spec.containers[0].workingDir: not supported"),
        (BASE + "---\n" + BASE, "runs one Pod, the input has 2 objects"),
    ],
)
def test_the_cli_refuses_in_one_line_with_exit_2(tmp_path, capsys, text, message):
    path = tmp_path / "pod.yaml"
    path.write_text(text)
    assert main(["lab", "pod", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gpuzombie: error: ") and message in err[0], err
    assert not (tmp_path / "out").exists()


def test_a_number_where_the_api_takes_a_string_is_refused():
    """The API server refuses ``args: [sleep, 30]``; the lab ran it before (its own reader took str(30))."""
    with pytest.raises(ManifestError, match=r"spec.containers\[0\].args holds something other than strings"):
        parse_pod(pod(BASE.replace('args: [sh, -c, "sleep 1"]', "args: [sleep, 30]")))


def test_a_nesting_too_deep_is_one_line_not_an_internal_error(tmp_path, capsys):
    """Before: ``gpuzombie: internal error: RecursionError`` (yaml.safe_load_all recursed); now the
    lab reads with check's loader (k8s.podspec.loader.load_documents), which bounds the nesting."""
    path = tmp_path / "deep.yaml"
    path.write_text("[" * 100_000)
    assert main(["lab", "pod", str(path), "--out", str(tmp_path / "out")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"gpuzombie: error: {path}: not YAML or JSON") and "internal" not in line, line
