"""`gpuzombie lab pod --device cuda` on a private containerd with the GPU's devices: pod-nofix waits
the whole grace holding real GPU memory, the webhook's shareProcessNamespace fix frees it at once
(the patched manifest: the real ``gpuzombie webhook --patch deploy/pod-nofix.yaml``, run here)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gpupods import GPU_TEST
from gpuzombie.cli.main import main
from webhook_output import ROOT, UNPATCHED, webhook_patch

pytest.importorskip("yaml", reason="lab pod reads manifests with PyYAML (carry it in .whl/)")
pytest.importorskip(
    "ruamel.yaml", reason="gpuzombie webhook --patch writes its fix with ruamel.yaml (carry it in .whl/)"
)
ARCHIVES = ROOT / ".lab-images"
GRACE = 5
pytestmark = [
    *GPU_TEST,
    pytest.mark.skipif(
        not all(shutil.which(x) for x in ("containerd", "runc", "ctr")), reason="needs containerd, runc and ctr"
    ),
]


def run(tmp_path: Path, manifest: Path, evidence: Path) -> dict:
    out = tmp_path / "out"
    archives = ["--image-archives", str(ARCHIVES)] if ARCHIVES.is_dir() else []
    main(["lab", "pod", str(manifest), "--device", "cuda", "--grace", str(GRACE), *archives, "--out", str(out)])
    data = json.loads((out / "results.json").read_text())
    shutil.copytree(out, evidence / manifest.stem, dirs_exist_ok=True)
    ((_key, entry),) = data["scenarios"].items()
    return entry


@pytest.mark.parametrize("whole_grace", [True, False], ids=["unpatched", "webhook-patched"])
def test_gpu_memory_before_and_after_the_webhooks_fix(tmp_path, evidence, whole_grace):
    manifest = UNPATCHED["pod-nofix"]
    if not whole_grace:
        manifest = tmp_path / "pod-nofix.webhook-patched.yaml"
        manifest.write_text(webhook_patch(UNPATCHED["pod-nofix"].read_text()))
    e = run(tmp_path, manifest, evidence)
    m = e["metrics"]
    assert e["probe"].startswith("NVML") and not e["cpu_standin"]
    assert m["held_at_delete_mib"] >= 1800  # the worker's 2048 MiB on the GPU
    assert m["waited_whole_grace"] is whole_grace and e["deletion"]["leftovers"] == []
    if whole_grace:
        assert m["release_latency_s"] >= GRACE - 0.2
    else:
        assert m["release_latency_s"] < 2.0
