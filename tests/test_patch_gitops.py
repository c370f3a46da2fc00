"""`gpuzombie webhook --patch` for GitOps (issue 24 point 5), on real public manifests
(tests/fixtures/gitops/SOURCES.md): only the fixed lines change (diff checked), comments, quoting,
block scalars and anchors are kept, an alias never yields a second mount, a file with nothing to fix
comes back byte-identical and is not written with --in-place, the patched objects validate strictly
(kubernetes-validate) and check clean, a second patch changes nothing, and the install image is
never a silent default."""

from __future__ import annotations

import difflib
import os
import pathlib
from typing import Any

import pytest

from admission_support import validate_pod
from test_check import gpuzombie, one_line_error

yaml = pytest.importorskip("yaml", reason="PyYAML is in the 'admission' extra")
pytest.importorskip("ruamel.yaml", reason="ruamel.yaml is in the 'admission' extra")

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "gitops"
VLLM = FIXTURES / "kubernetes-examples_vllm-deployment.yaml"
OPENARC = FIXTURES / "openarc_kubernetes-simple-deployment.yaml"
IMAGE = "registry.example.com/gpu-zombie/gpuzombie-node:0.1.0"
MOUNT = {"name": "gpuzombie-bin", "mountPath": "/.gpuzombie", "readOnly": True}


def patch(path: pathlib.Path | str, *flags: str, stdin: str | None = None) -> str:
    done = gpuzombie("webhook", "--patch", str(path), *flags, stdin=stdin)
    assert done.returncode == 0, done.stderr
    return done.stdout


def changes(before: str, after: str) -> tuple[list[str], list[str]]:
    """(removed lines, added lines) of a line diff."""
    removed, added = [], []
    for line in difflib.ndiff(before.splitlines(), after.splitlines()):
        if line.startswith("- "):
            removed.append(line[2:])
        elif line.startswith("+ "):
            added.append(line[2:])
    return removed, added


def containers(doc: dict[str, Any], field: str = "containers") -> list[dict[str, Any]]:
    return doc["spec"]["template"]["spec"].get(field, [])


def test_a_real_gpu_deployment_changes_only_where_the_fix_is(tmp_path):
    before = VLLM.read_text()
    after = patch(VLLM, "--image", IMAGE)
    removed, added = changes(before, after)
    assert removed == ['        command: ["python3", "-m", "vllm.entrypoints.openai.api_server"]']
    assert added[:2] == ["      annotations:", "        gpuzombie.dev/injected: tini:inference-server"]
    command = (
        '        command: [/.gpuzombie/tini-static, -s, -g, --, "python3", "-m", "vllm.entrypoints.openai.api_server"]'
    )
    assert command in added  # flow style and the original quotes kept
    assert all(not line.lstrip().startswith("#") for line in added)
    comments = [line for line in before.splitlines() if line.lstrip().startswith("#")]
    assert len(comments) == 24 and [line for line in after.splitlines() if line.lstrip().startswith("#")] == comments
    assert "        emptyDir:\n            medium: Memory\n" in after  # the file's own odd indentation, kept
    doc = yaml.safe_load(after)
    validate_pod(doc)
    (server,) = containers(doc)
    assert server["volumeMounts"].count(MOUNT) == 1 and containers(doc, "initContainers")[0]["image"] == IMAGE
    assert gpuzombie("check", "-", stdin=after).returncode == 0
    assert patch("-", "--image", IMAGE, stdin=after) == after  # idempotent, byte for byte


def test_a_file_with_nothing_to_fix_is_byte_identical_and_not_written(tmp_path):
    text = OPENARC.read_text()  # CPU only: anchors, a block scalar, comments, two documents
    assert patch(OPENARC) == text
    copy = tmp_path / "openarc.yaml"
    copy.write_text(text)
    os.utime(copy, (1_000_000_000, 1_000_000_000))
    inode = copy.stat().st_ino
    done = gpuzombie("webhook", "--patch", str(tmp_path), "--in-place")
    assert done.returncode == 0 and "patched" not in done.stderr, done.stderr
    assert copy.stat().st_mtime == 1_000_000_000 and copy.stat().st_ino == inode and copy.read_text() == text


def gpu_openarc() -> str:
    """The OpenArc manifest with its server made a GPU container with a command (the one change made
    here): its ``volumeMounts: *mounts`` is the init container's list, aliased."""
    text = OPENARC.read_text()
    server = "        - name: openarc\n          image: *image\n"
    assert text.count(server) == 1
    gpu = server + "          command: [openarc, serve]\n          resources: {limits: {nvidia.com/gpu: 1}}\n"
    return text.replace(server, gpu)


def test_an_alias_shared_with_an_unchanged_container_is_copied_out_not_written_through(tmp_path):
    before = gpu_openarc()
    (tmp_path / "openarc.yaml").write_text(before)
    done = gpuzombie("webhook", "--patch", str(tmp_path), "--in-place", "--image", IMAGE)
    assert done.returncode == 0 and "patched" in done.stderr, done.stderr
    after = (tmp_path / "openarc.yaml").read_text()
    deployment, service = yaml.safe_load_all(after)
    validate_pod(deployment)
    assert service == list(yaml.safe_load_all(before))[1]
    install, prepare = containers(deployment, "initContainers")
    assert install["name"] == "gpuzombie-install" and prepare["name"] == "prepare-model"
    assert MOUNT not in prepare["volumeMounts"]  # the init container's list is not written through
    (server,) = containers(deployment)
    assert server["volumeMounts"] == [{"name": "models", "mountPath": "/models"}, MOUNT]
    removed, _ = changes(before, after)
    assert removed == ["          command: [openarc, serve]", "          volumeMounts: *mounts"]
    script = before[before.index("            - |\n") : before.index("          volumeMounts: &mounts")]
    assert script in after  # the block scalar, byte for byte
    for anchor in ("&app_name", "&labels", "&image", "&model_name", "&config_file_var", "&mounts"):
        assert anchor in after
    assert gpuzombie("check", str(tmp_path)).returncode == 0
    again = gpuzombie("webhook", "--patch", str(tmp_path), "--in-place", "--image", IMAGE)
    assert again.returncode == 0 and "patched" not in again.stderr and (tmp_path / "openarc.yaml").read_text() == after


SHARED = """\
apiVersion: batch/v1
kind: Job
metadata:
  name: train  # two GPU workers, one list of mounts
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: worker-0
          image: registry.example.com/ml/train:2.1
          command: [python3, train.py, --rank=0]
          resources: &gpu
            limits:
              nvidia.com/gpu: 1
          volumeMounts: &mounts
            - name: data
              mountPath: /data
        - name: worker-1
          image: registry.example.com/ml/train:2.1
          command: [python3, train.py, --rank=1]
          resources: *gpu
          volumeMounts: *mounts
      volumes:
        - name: data
          emptyDir: {}
"""


def test_containers_sharing_an_alias_get_the_mount_once():
    after = patch("-", "--image", IMAGE, stdin=SHARED)
    job = yaml.safe_load(after)
    validate_pod(job)  # two mounts at one path would be refused: "must be unique"
    for worker in containers(job):
        assert worker["volumeMounts"] == [{"name": "data", "mountPath": "/data"}, MOUNT], worker["name"]
    assert "volumeMounts: *mounts" in after and "volumeMounts: &mounts" in after  # the alias is kept
    removed, _ = changes(SHARED, after)
    assert removed == [
        "          command: [python3, train.py, --rank=0]",
        "          command: [python3, train.py, --rank=1]",
    ]
    assert patch("-", "--image", IMAGE, stdin=after) == after


def test_the_install_image_is_required_where_the_fix_adds_it(tmp_path):
    copy = tmp_path / "vllm.yaml"  # --in-place: a printed --patch takes the chart's default (test_webhook_patch_image)
    copy.write_text(VLLM.read_text())
    shown = one_line_error(gpuzombie("webhook", "--patch", str(copy), "--in-place"))
    assert "Deployment/vllm-gemma-deployment" in shown and "--image" in shown and "localhost" not in shown
    assert copy.read_text() == VLLM.read_text()
    config = tmp_path / "gpuzombie.yaml"
    config.write_text("image: registry.example.com/from-config:1\n")
    from_config = yaml.safe_load(patch(VLLM, "--config", str(config)))
    assert containers(from_config, "initContainers")[0]["image"] == "registry.example.com/from-config:1"
    chosen = yaml.safe_load(patch(VLLM, "--config", str(config), "--image", IMAGE))  # the flag wins
    assert containers(chosen, "initContainers")[0]["image"] == IMAGE
    config.write_text("image: ''\n")
    assert "expected an image reference" in one_line_error(
        gpuzombie("webhook", "--patch", str(VLLM), "--config", str(config))
    )
    config.write_text("images: x\n")
    assert "expected a map with the keys image" in one_line_error(
        gpuzombie("webhook", "--patch", str(VLLM), "--config", str(config))
    )
    # a fix that needs no init container (the image's ENTRYPOINT: shareProcessNamespace) needs no image
    assert yaml.safe_load(patch(pathlib.Path(__file__).resolve().parents[1] / "deploy" / "pod-nofix.yaml"))


def test_in_place_refuses_stdin_and_printing_refuses_several_files(tmp_path):
    assert "--in-place" in one_line_error(gpuzombie("webhook", "--patch", "-", "--in-place", stdin="kind: Pod\n"))
    (tmp_path / "a.yaml").write_text("kind: Pod\n")
    (tmp_path / "b.yaml").write_text("kind: Pod\n")
    assert "--in-place" in one_line_error(gpuzombie("webhook", "--patch", str(tmp_path)))
    assert "goes with --patch" in one_line_error(gpuzombie("webhook", "--in-place"))


def test_serving_without_an_image_is_refused(tmp_path):
    from pki import make_pki

    pki = make_pki(tmp_path)
    done = gpuzombie(
        "webhook",
        "--listen",
        "127.0.0.1:0",
        "--tls-cert",
        str(pki / "server.pem"),
        "--tls-key",
        str(pki / "server.key"),
    )
    assert "serving needs --image" in one_line_error(done)


def test_a_json_manifest_stays_json_indented_as_it_was(tmp_path):
    import json

    source = tmp_path / "vllm.json"
    source.write_text(json.dumps(yaml.safe_load(VLLM.read_text()), indent=2) + "\n")
    after = patch(source, "--image", IMAGE)
    doc = json.loads(after)  # still JSON, not YAML's flow style
    validate_pod(doc)
    assert containers(doc)[0]["command"][:4] == ["/.gpuzombie/tini-static", "-s", "-g", "--"]
    removed, _ = changes(source.read_text(), after)
    assert all(line.strip() in ("}", "]") for line in removed), removed  # only a closing bracket gains a comma
    assert patch("-", "--image", IMAGE, stdin=after) == after


def test_patch_takes_the_gpu_device_classes_check_takes(tmp_path):
    """JobSet's DRA example asks for gpu.example.com: no GPU class by default, so nothing to fix;
    with --gpu-device-class the same claim is a GPU and its worker is fixed, as `check` counts it."""
    jobset = pathlib.Path(__file__).parent / "fixtures" / "fleet" / "jobset"
    both = tmp_path / "both.yaml"
    both.write_text("\n---\n".join(p.read_text() for p in sorted(jobset.glob("*.yaml"))))
    assert patch(both, "--image", IMAGE) == both.read_text()
    fixed = patch(both, "--image", IMAGE, "--gpu-device-class", "gpu.example.com")
    assert fixed != both.read_text() and "tini" in fixed and IMAGE in fixed
    # serving sees a pod alone, which names no device class: the flag is refused there, not ignored
    done = gpuzombie(
        "webhook", "--image", IMAGE, "--gpu-device-class", "gpu.example.com", "--tls-cert", "c", "--tls-key", "k"
    )
    assert "goes with --patch" in one_line_error(done)


def alias_bomb(depth: int, *, in_a_mount: bool = False) -> str:
    """A GPU Pod with an alias bomb: ``l0`` nine strings, each ``lN`` nine aliases of ``lN-1`` (9**depth
    paths to a string). In the pod's own field ``x-bomb``, or (``in_a_mount``) also under a mount of a
    list the GPU container shares with an init container, which the fix copies out of its alias."""
    lines = ["apiVersion: v1", "kind: Pod", "metadata:", "  name: bomb", "x-bomb:"]
    lines += ["  l0: &l0 [" + ", ".join(["lol"] * 9) + "]"]
    lines += [f"  l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, depth + 1)]
    lines += ["spec:", "  initContainers:", "  - name: setup", "    image: busybox", "    command: [sh, -c, 'true']"]
    lines += ["    volumeMounts: &mounts", "    - name: data", "      mountPath: /data"]
    lines += [f"      x-bomb: *l{depth}"] if in_a_mount else []
    lines += ["  containers:", "  - name: main", "    image: pytorch/pytorch:2.4.0", "    command: [python3, train.py]"]
    lines += ["    volumeMounts: *mounts", "    resources:", "      limits:", "        nvidia.com/gpu: 1"]
    lines += ["  volumes:", "  - name: data", "    emptyDir: {}"]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(("depth", "in_a_mount"), [(20, False), (7, True)], ids=["beside-the-pod", "in-a-copied-mount"])
def test_an_alias_bomb_costs_its_size_not_its_paths(depth, in_a_mount):
    """Issue 36 item 10. Before: the check of the written text compared the trees with ``==`` (every
    path through the aliases: 35 s at depth 9 beside the pod, measured), and a list copied out of its
    alias was copied path by path (depth 5: 19.7 s and 11.7 MB written; depth 6 over 120 s; kept at
    depth 7 here, so that the old code's copy stays within memory until the timeout). Now: each pair
    of nodes compared once, an anchored node inside a copy kept as its alias. The CLI's 60 s timeout
    is the bound (0.3 s measured, idle and at load 5)."""
    before = alias_bomb(depth, in_a_mount=in_a_mount)
    after = patch("-", "--image", IMAGE, stdin=before)
    assert len(after) < 2 * len(before) + 4096  # nothing expanded
    assert after.count(f"*l{depth - 1}") == 9 and (f"      x-bomb: *l{depth}" in after) is in_a_mount
    pod = yaml.safe_load(after)
    (init, setup) = pod["spec"]["initContainers"]
    assert MOUNT not in setup["volumeMounts"] and MOUNT in pod["spec"]["containers"][0]["volumeMounts"]
    assert init["name"] == "gpuzombie-install"
    assert patch("-", "--image", IMAGE, stdin=after) == after


def test_the_comparison_takes_each_pair_once_and_stops_at_its_bound():
    from gpuzombie.admission.gitops import PatchError, same

    def bomb(depth: int) -> list[Any]:
        level: list[Any] = ["lol"] * 9
        for _ in range(depth):
            level = [level] * 9
        return level

    assert same(bomb(60), bomb(60))  # 9**60 paths, 61 pairs
    assert not same(bomb(60), [*bomb(59)[:8], bomb(58)])
    assert not same({"a": [1]}, {"a": [True]}) and not same({"a": 1}, {"a": 1.0}) and not same([], {})
    loop: list[Any] = []
    loop.append(loop)
    other: list[Any] = []
    other.append(other)
    assert same(loop, other)  # a loop of aliases ends
    with pytest.raises(PatchError, match="over 10 maps and lists"):
        same([[i] for i in range(20)], [[i] for i in range(20)], budget=10)
