"""The exporter's series join with dcgm-exporter's (``on(UUID)``) and kube-state-metrics'
(``on(namespace, pod)``, and ``uid`` where a terminating pod and its replacement share a name),
tested with ``promtool test rules`` on the series the exporter really exposes for the fake node of
test_exporter.py, beside those two exporters' series in their label names (tests/promql/)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("yaml", reason="PyYAML is in the 'chart' extra")
pytest.importorskip("prometheus_client", reason="prometheus-client is in the 'exporter' extra")

import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import test_exporter as fake
from gpuzombie.exporter import NodeCollector
from gpuzombie.units import MIB

PROMQL = Path(__file__).resolve().parent / "promql"
PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="needs promtool (Debian prometheus; make debian)")

NOFIX = {"namespace": "gpu-zombie-test", "pod": "gpu-zombie-nofix", "pod_uid": fake.UID_A, "container": "worker"}
REPLACEMENT_UID = "abcdef00-0000-4000-8000-000000000001"

# The joins of docs/runtime.md, as written there.
FB_OF_GHOST_GPUS = 'gpuzombie_gpu_memory_verdict{verdict="ghost"} * on(UUID) group_left DCGM_FI_DEV_FB_USED'
GHOST_SHARE = (
    "gpuzombie_gpu_unexplained_memory_bytes / on(UUID) group_left(modelName) (DCGM_FI_DEV_FB_USED * 1024 * 1024)"
)
ZOMBIES_WITH_OWNER = (
    "gpuzombie_zombies * on(namespace, pod) group_left(node, created_by_kind, created_by_name) kube_pod_info"
)
ZOMBIES_BY_UID = (
    'label_replace(gpuzombie_zombies, "uid", "$1", "pod_uid", "(.+)") * on(namespace, pod, uid) group_left(node) '
    "kube_pod_info"
)


def _series(text: str) -> list[dict[str, str]]:
    """An exposition as promtool input series, each value held for the test's few minutes."""
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out.append({"series": f"{s.name}{{{labels}}}", "values": f"{s.value!r}x5"})
    return out


def _recorded(name: str) -> list[dict[str, str]]:
    return _series((PROMQL / name).read_text())


def _ours(tmp_path: Path) -> list[dict[str, str]]:
    root = tmp_path / "proc"
    fake.build_node(root)
    registry = CollectorRegistry()
    registry.register(NodeCollector(lambda: fake.fake_scan(root), min_interval=60))
    return [s for s in _series(generate_latest(registry).decode()) if s["series"].startswith("gpuzombie_")]


def _sample(labels: dict[str, str], value: float) -> dict:
    return {"labels": "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}", "value": value}


def _gpu(index: str, uuid: str, **extra: str) -> dict[str, str]:
    return {"gpu": index, "UUID": uuid, "Hostname": "gpu-node-1", **extra}


def test_joins_with_dcgm_exporter_and_kube_state_metrics(tmp_path):
    ours = _ours(tmp_path)
    dcgm, ksm = _recorded("dcgm-exporter.prom"), _recorded("kube-state-metrics.prom")
    # A StatefulSet's replacement of gpu-zombie-nofix, already on another node while the old one terminates.
    replacement = (
        'kube_pod_info{created_by_kind="StatefulSet",created_by_name="gpu-zombie-nofix",namespace="gpu-zombie-test",'
        f'node="gpu-node-2",pod="gpu-zombie-nofix",uid="{REPLACEMENT_UID}"}}'
    )
    at = "1m"
    tests = [
        {
            "interval": "1m",
            "input_series": ours + dcgm + ksm,
            "promql_expr_test": [
                {
                    "expr": FB_OF_GHOST_GPUS,
                    "eval_time": at,
                    "exp_samples": [
                        _sample(_gpu("0", "GPU-0000", verdict="ghost"), 4273),
                        # GPU 1 is ok: no ghost series at all (one verdict series a GPU, issue 28)
                    ],
                },
                {
                    "expr": GHOST_SHARE,
                    "eval_time": at,
                    "exp_samples": [
                        _sample(_gpu("0", "GPU-0000", modelName="NVIDIA H200"), 1000 * MIB / (4273 * 1024 * 1024)),
                        _sample(_gpu("1", "GPU-1111", modelName="NVIDIA H200"), 0),
                    ],
                },
                {
                    "expr": ZOMBIES_WITH_OWNER,
                    "eval_time": at,
                    "exp_samples": [
                        _sample(
                            {
                                **NOFIX,
                                "node": "gpu-node-1",
                                "created_by_kind": "StatefulSet",
                                "created_by_name": "gpu-zombie-nofix",
                            },
                            1,
                        )
                    ],
                },
            ],
        },
        {
            "interval": "1m",
            "input_series": [*ours, *ksm, {"series": replacement, "values": "1x5"}],
            "promql_expr_test": [
                {
                    "expr": ZOMBIES_BY_UID,
                    "eval_time": at,
                    "exp_samples": [_sample({**NOFIX, "uid": fake.UID_A, "node": "gpu-node-1"}, 1)],
                },
            ],
        },
    ]
    test_file = tmp_path / "joins.test.yml"
    test_file.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "1m", "tests": tests}))
    done = subprocess.run(
        [PROMTOOL, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_docs_show_the_tested_joins():
    text = (Path(__file__).resolve().parent.parent / "docs" / "runtime.md").read_text()
    flat = " ".join(text.split())
    for expr in (FB_OF_GHOST_GPUS, GHOST_SHARE, ZOMBIES_WITH_OWNER, ZOMBIES_BY_UID):
        assert " ".join(expr.split()) in flat, expr


# Under MIG dcgm-exporter has one series per GPU instance, all with the GPU's UUID: on(UUID) alone
# would match many to many. GPU_I_ID is absent on both sides without MIG, so these also join whole GPUs.
MIG_FB_OF_GHOSTS = 'gpuzombie_gpu_memory_verdict{verdict="ghost"} * on(UUID, GPU_I_ID) group_left DCGM_FI_DEV_FB_USED'
MIG_GHOST_SHARE = (
    "gpuzombie_gpu_unexplained_memory_bytes / on(UUID, GPU_I_ID) group_left(modelName) "
    "(DCGM_FI_DEV_FB_USED * 1024 * 1024)"
)


def test_mig_instances_join_dcgm_exporter_on_uuid_and_gpu_i_id(tmp_path):
    import test_mig

    ours = [
        s
        for s in _series(test_mig.exposition(test_mig.build_node(tmp_path / "proc")))
        if s["series"].startswith("gpuzombie_")
    ]
    gi1 = _gpu("0", "GPU-0000", GPU_I_ID="1", GPU_I_PROFILE="1g.18gb")
    gi2 = _gpu("0", "GPU-0000", GPU_I_ID="2", GPU_I_PROFILE="3g.71gb")
    whole = _gpu("1", "GPU-1111")
    model = {"modelName": "NVIDIA H200"}
    unexplained = 13 * MIB + 2048 * MIB
    tests = [
        {
            "interval": "1m",
            "input_series": ours + _recorded("dcgm-exporter-mig.prom"),
            "promql_expr_test": [
                {
                    "expr": MIG_FB_OF_GHOSTS,
                    "eval_time": "1m",
                    "exp_samples": [
                        _sample({**gi1, "verdict": "ghost"}, 12301),  # the others are ok: no ghost series
                    ],
                },
                {
                    "expr": MIG_GHOST_SHARE,
                    "eval_time": "1m",
                    "exp_samples": [
                        _sample({**gi1, **model}, unexplained / (12301 * MIB)),
                        _sample({**gi2, **model}, 13 * MIB / (13 * MIB)),
                        _sample({**whole, **model}, 0),
                    ],
                },
            ],
        }
    ]
    test_file = tmp_path / "mig-joins.test.yml"
    test_file.write_text(yaml.safe_dump({"rule_files": [], "evaluation_interval": "1m", "tests": tests}))
    done = subprocess.run(
        [PROMTOOL, "test", "rules", str(test_file)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    flat = " ".join((Path(__file__).resolve().parent.parent / "docs" / "runtime.md").read_text().split())
    for expr in (MIG_FB_OF_GHOSTS, MIG_GHOST_SHARE):
        assert " ".join(expr.split()) in flat, expr
