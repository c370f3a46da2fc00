"""The CDI spec parser (k8s.cdi) on spec files in the shapes NVIDIA's DRA driver and nvidia-ctk
write them (tests/fixtures/cdi/README.md says where each shape comes from), and hostile ones."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from gpuzombie.k8s.cdi import MAX_SPEC_BYTES, parse_spec, read_cdi_devices

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "cdi"
CLAIM = "dab5ab50-d59a-42a6-af16-cfd4628c0f7a"
MIG_CLAIM = "5f0e1c7a-9b2d-4c1e-8a77-3d2f6b1e9c40"


def test_the_dra_drivers_claim_specs_name_each_devices_gpu_node():
    """A whole GPU: its /dev/nvidia1 (not /dev/nvidiactl, minor 255, nor the DRM nodes); a MIG
    device: its parent's node (the nvidia-caps nodes name its GPU and compute instance)."""
    got = read_cdi_devices([str(FIXTURES)])
    assert got.warnings == ()
    assert got.gpu_minors[f"k8s.gpu.nvidia.com/claim={CLAIM}-gpu-1"] == (1,)
    assert got.gpu_minors[f"k8s.gpu.nvidia.com/claim={MIG_CLAIM}-gpu-0-mig-1g24gb-14-0"] == (0,)


def test_nvidia_ctk_node_spec_by_index_uuid_and_all():
    got = read_cdi_devices([str(FIXTURES)]).gpu_minors
    assert got["nvidia.com/gpu=0"] == got["nvidia.com/gpu=GPU-955ef018-3bd9-5f27-80b3-fa20ee8d19c5"] == (0,)
    assert got["nvidia.com/gpu=1"] == (1,)  # path /dev/nvidia1, hostPath under the driver root
    assert got["nvidia.com/gpu=all"] == (0, 1)


def test_a_stated_minor_number_is_the_gpus_number():
    """nvcdi stats the node: its minor field is the number itself (195 is NVIDIA's major)."""
    node = {"path": "/dev/nvidia3", "major": 195, "minor": 7}
    spec = {
        "cdiVersion": "0.5.0",
        "kind": "v.com/c",
        "devices": [{"name": "d", "containerEdits": {"deviceNodes": [node]}}],
    }
    assert parse_spec(spec) == {"v.com/c=d": (7,)}
    node["major"] = 226  # not NVIDIA's: the name says it
    assert parse_spec(spec) == {"v.com/c=d": (3,)}


def test_spec_level_gpu_nodes_go_with_every_device():
    spec = {
        "kind": "v.com/c",
        "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia2"}]},
        "devices": [{"name": "a", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}, {"name": "b"}],
    }
    assert parse_spec(spec) == {"v.com/c=a": (0, 2), "v.com/c=b": (2,)}


@pytest.mark.parametrize(
    "spec",
    [
        [],
        {"devices": []},
        {"kind": "no-class", "devices": []},
        {"kind": "v.com/c", "devices": {"name": "a"}},
        {"kind": "v.com/c", "devices": ["a"]},
        {"kind": "v.com/c", "devices": [{"name": 3}]},
        {"kind": "v.com/c", "devices": [{"name": "a", "containerEdits": {"deviceNodes": "/dev/nvidia0"}}]},
        {"kind": "v.com/c", "devices": [{"name": "a", "containerEdits": {"deviceNodes": [7]}}]},
    ],
)
def test_shapes_that_are_no_cdi_spec(spec):
    with pytest.raises(ValueError):
        parse_spec(spec)


def test_each_bad_file_is_one_warning_and_the_rest_is_read(tmp_path):
    shutil.copy(FIXTURES / f"k8s.gpu.nvidia.com-claim_{CLAIM}.yaml", tmp_path)
    (tmp_path / "broken.yaml").write_text("kind: [unclosed\n")
    (tmp_path / "notaspec.json").write_text(json.dumps({"kind": "x"}))
    (tmp_path / "huge.json").write_bytes(b" " * (MAX_SPEC_BYTES + 1))
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "ignored.txt").write_text("not a spec name")
    got = read_cdi_devices([str(tmp_path), str(tmp_path / "absent")])
    assert list(got.gpu_minors) == [f"k8s.gpu.nvidia.com/claim={CLAIM}-gpu-1"]
    assert len(got.warnings) == 5 and all("\n" not in w and w.startswith("CDI spec ") for w in got.warnings)


def test_a_later_directory_replaces_a_device(tmp_path):
    first, second = tmp_path / "etc", tmp_path / "run"
    for d, node in ((first, "/dev/nvidia0"), (second, "/dev/nvidia1")):
        d.mkdir()
        spec = {"kind": "v.com/c", "devices": [{"name": "a", "containerEdits": {"deviceNodes": [{"path": node}]}}]}
        (d / "v.json").write_text(json.dumps(spec))
    assert read_cdi_devices([str(first), str(second)]).gpu_minors == {"v.com/c=a": (1,)}


def test_without_pyyaml_the_yaml_specs_are_one_warning(monkeypatch):
    """The node extra has no PyYAML: the JSON specs are read, the YAML ones counted in one line."""
    monkeypatch.setitem(sys.modules, "yaml", None)  # import yaml raises ImportError
    got = read_cdi_devices([str(FIXTURES)])
    assert set(got.gpu_minors) == {
        f"nvidia.com/gpu={n}" for n in ("0", "1", "all", "GPU-955ef018-3bd9-5f27-80b3-fa20ee8d19c5")
    }
    assert got.warnings == ("CDI specs: 2 YAML spec(s) not read: PyYAML is not installed",)
