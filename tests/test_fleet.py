"""Issue 24: the workloads real GPU fleets run. A corpus of real public manifests
(tests/fixtures/fleet/, SOURCES.md: repository, path, commit) with the findings written down by
hand after reading each; GPU recognition beyond device-plugin resources; the shell read as real
shells run it (bash, dash and busybox here, as PID 1 in a real PID namespace where it matters)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from gpuzombie.admission import rules
from gpuzombie.admission.pid1 import analyse_argv, container_pid1
from gpuzombie.admission.report import CheckReport
from gpuzombie.k8s.podspec.gpus import GPU_DEVICE_CLASSES, GpuContext, GpuForm, claim_classes
from gpuzombie.k8s.podspec.loader import load_documents
from gpuzombie.k8s.podspec.templates import pod_templates
from pidns import PidNamespace, wait_until

FLEET = Path(__file__).parent / "fixtures" / "fleet"

# file -> [(template path, GPU containers, ((container, rule, severity), ...))], by hand after reading
# each manifest. GZ006: command not set (the operator's or the image's ENTRYPOINT runs). GZ002:
# PID 1 known and not an init (a program, or a shell that traps SIGTERM). GZ008: a shell that
# stays PID 1 and drops SIGTERM (`sh -c`: dash, the CUDA images' sh): the whole grace, certain. GZ007: a GPU request where no pod template is (TrainJob's
# resourcesPerNode: the pods come from a runtime not in the file). KServe's predictor.tensorflow is
# one container (kserve-container) whose command the ServingRuntime gives: GZ006.
PLAIN = ()
EXPECTED: dict[str, list[tuple[str, tuple[str, ...], tuple[tuple[str | None, str, str], ...]]]] = {
    "argo/coreweave_argo-workflow_gpu-say-workflow.yaml": [  # a script template: argoexec is PID 1, an init
        ("spec.templates[1].script", ("main",), PLAIN)
    ],
    "argo/gke-kueue-dws_workflow-helloworld-cc.yaml": [("spec.templates[0].container", ("main",), PLAIN)],
    "knative/gke-kueue-dws_llama3-knative-service.yaml": [  # python3 -m vllm... as PID 1
        ("spec.template", ("vllm",), (("vllm", "GZ002", "warning"),))
    ],
    "dra-driver/demo_specs_extended-resources_gpu-full.yaml": [
        ("", ("cuda-container",), (("cuda-container", "GZ006", "note"),))
    ],
    "dra-driver/demo_specs_imex_nvbandwidth-test-job.yaml": [  # MPIJob: sshd as PID 1 in the workers
        ("spec.mpiReplicaSpecs.Launcher.template", (), PLAIN),
        ("spec.mpiReplicaSpecs.Worker.template", ("mpi-worker",), (("mpi-worker", "GZ002", "warning"),)),
    ],
    "dra-driver/demo_specs_mig+mps_sharing-demo-claims.yaml": [],  # claims only
    "dra-driver/demo_specs_quickstart_v1_gpu-test-mps.yaml": [  # DRA claim of gpu.nvidia.com, trap idiom
        ("", ("mps-ctr0", "mps-ctr1"), (("mps-ctr0", "GZ002", "warning"), ("mps-ctr1", "GZ002", "warning")))
    ],
    "jobset/site_static_examples_workload-aware-scheduling_dra_jobset.yaml": [  # DRA claim, assumed GPU
        ("spec.replicatedJobs[0].template.spec.template", ("worker",), (("worker", "GZ008", "error"),))
    ],
    "jobset/site_static_examples_workload-aware-scheduling_dra_resourceclaimtemplate.yaml": [],
    "kai/batch_pytorch-job.yaml": [
        ("spec.pytorchReplicaSpecs.Master.template", ("pytorch",), (("pytorch", "GZ006", "note"),)),
        ("spec.pytorchReplicaSpecs.Worker.template", ("pytorch",), (("pytorch", "GZ006", "note"),)),
    ],
    "kai/gpu-sharing_gpu-sharing-init-container.yaml": [  # gpu-fraction given to an init container
        ("", ("gpu-init",), (("gpu-init", "GZ002", "warning"),))
    ],
    "kai/gpu-sharing_gpu-sharing-non-default-container.yaml": [  # ... to the container it names
        ("", ("gpu-workload",), (("gpu-workload", "GZ002", "warning"),))
    ],
    "kai/gpu-sharing_gpu-sharing.yaml": [("", ("gpu-workload",), (("gpu-workload", "GZ002", "warning"),))],
    "kai/quickstart_pods_gpu-pod.yaml": [("", ("main",), (("main", "GZ002", "warning"),))],  # trap idiom
    "kai/ray_ray-job.yaml": [
        ("spec.rayClusterSpec.headGroupSpec.template", ("ray-head",), (("ray-head", "GZ006", "note"),)),
        ("spec.rayClusterSpec.workerGroupSpecs[0].template", ("ray-worker",), (("ray-worker", "GZ006", "note"),)),
    ],
    "kserve/samples_accelerators_tensorflow-gpu.yaml": [  # the ServingRuntime's container, its PID 1 not in the file
        ("spec.predictor.tensorflow", ("kserve-container",), (("kserve-container", "GZ006", "note"),))
    ],
    "kserve/samples_autoscaling_autoscale_gpu.yaml": [  # the ServingRuntime's container, its PID 1 not in the file
        ("spec.predictor.tensorflow", ("kserve-container",), (("kserve-container", "GZ006", "note"),))
    ],
    "kserve/samples_llmisvc_agentic-tool-calling_llmisvc-single-gpu.yaml": [  # a bare PodSpec
        ("spec.template", ("main",), (("main", "GZ006", "note"),))
    ],
    "kserve/samples_llmisvc_agentic-tool-calling_nemotron-3-ultra-pd.yaml": [  # decode and prefill
        ("spec.template", ("main",), (("main", "GZ006", "note"),)),
        ("spec.prefill.template", ("main",), (("main", "GZ006", "note"),)),
    ],
    "kserve/samples_v1beta1_custom_custom_model_custom.yaml": [  # predictor with containers, CPU only
        ("spec.predictor", (), PLAIN),
        ("spec.predictor", (), PLAIN),
    ],
    "kserve/samples_llmisvc_e2e-gpt-oss_inference_default.yaml": [  # containers without an image
        ("spec.template", ("main",), (("main", "GZ006", "note"),))
    ],
    "kuberay/ray-operator_config_samples_pytorch-resnet-image-classifier_ray-job.pytorch-image-classifier.yaml": [
        ("spec.rayClusterSpec.headGroupSpec.template", (), PLAIN),
        ("spec.rayClusterSpec.workerGroupSpecs[0].template", ("ray-worker",), (("ray-worker", "GZ006", "note"),)),
    ],
    "kuberay/ray-operator_config_samples_ray-cluster.sample.yaml": [  # CPU only
        ("spec.headGroupSpec.template", (), PLAIN),
        ("spec.workerGroupSpecs[0].template", (), PLAIN),
    ],
    "kuberay/ray-operator_config_samples_ray-cluster.verl.yaml": [
        ("spec.headGroupSpec.template", ("ray-head",), (("ray-head", "GZ006", "note"),))
    ],
    "kuberay/ray-operator_config_samples_ray-job.batch-inference.yaml": [
        ("spec.rayClusterSpec.headGroupSpec.template", ("ray-head",), (("ray-head", "GZ006", "note"),))
    ],
    "kuberay/ray-operator_config_samples_ray-service.llm-serve.yaml": [
        ("spec.rayClusterConfig.headGroupSpec.template", (), PLAIN),
        ("spec.rayClusterConfig.workerGroupSpecs[0].template", ("ray-worker",), (("ray-worker", "GZ006", "note"),)),
    ],
    "lws/sglang_lws.yaml": [  # python3 as PID 1
        ("spec.leaderWorkerTemplate.leaderTemplate", ("sglang-leader",), (("sglang-leader", "GZ002", "warning"),)),
        ("spec.leaderWorkerTemplate.workerTemplate", ("sglang-worker",), (("sglang-worker", "GZ002", "warning"),)),
    ],
    "lws/tensorrt-llm_lws.yaml": [  # sh -c 'a; b': dash stays PID 1
        ("spec.leaderWorkerTemplate.leaderTemplate", ("leader",), (("leader", "GZ008", "error"),)),
        ("spec.leaderWorkerTemplate.workerTemplate", ("worker",), (("worker", "GZ008", "error"),)),
    ],
    "lws/vllm_GPU_lws.yaml": [  # sh -c 'bash …': dash stays PID 1
        ("spec.leaderWorkerTemplate.leaderTemplate", ("vllm-leader",), (("vllm-leader", "GZ008", "error"),)),
        ("spec.leaderWorkerTemplate.workerTemplate", ("vllm-worker",), (("vllm-worker", "GZ008", "error"),)),
    ],
    "trainer/flux_lammps-train-gpus.yaml": [  # TrainJob: resourcesPerNode, the runtime is elsewhere
        ("spec.trainer.resourcesPerNode.limits.nvidia.com/gpu", (), ((None, "GZ007", "warning"),))
    ],
    "trainer/manifests_base_runtimes_data-cache_torch_distributed_with_cache.yaml": [  # CPU only
        ("spec.template.spec.replicatedJobs[0].template.spec.template", (), PLAIN),
        ("spec.template.spec.replicatedJobs[1].template.spec.template", (), PLAIN),
    ],
    "trainer/manifests_base_runtimes_torchtune_llama3_2_llama3_2_1B.yaml": [
        ("spec.template.spec.replicatedJobs[0].template.spec.template", (), PLAIN),
        ("spec.template.spec.replicatedJobs[1].template.spec.template", (), PLAIN),
        ("spec.template.spec.replicatedJobs[2].template.spec.template", ("node",), (("node", "GZ002", "warning"),)),
    ],
    "trainer/yaml_01-multi-node.yaml": [],  # a TrainJob without GPUs
    "volcano/MindSpore-example_mindspore_gpu_mindspore-gpu.yaml": [  # bash execs sshd
        ("spec.tasks[0].template", (), PLAIN),
        ("spec.tasks[1].template", ("mpiworker",), (("mpiworker", "GZ002", "warning"),)),
    ],
    "volcano/integrations_argo_mpi_hello-world.yaml": [  # kubectl in an Argo container template; an
        ("spec.templates[1].container", (), PLAIN)  # embedded Volcano Job, nvidia.com/gpu: 0
    ],
    "volcano/integrations_mpi_mpi-example.yaml": [  # CPU only
        ("spec.tasks[0].template", (), PLAIN),
        ("spec.tasks[1].template", (), PLAIN),
    ],
}


def _read(path: Path, text: str | None = None, classes: frozenset[str] = GPU_DEVICE_CLASSES) -> CheckReport:
    report = CheckReport(gpu_device_classes=classes)
    report.add(str(path), path.read_text() if text is None else text)
    return report


def _summary(report: CheckReport) -> list[tuple[str, tuple[str, ...], tuple[tuple[str | None, str, str], ...]]]:
    return [
        (p.ref.path, p.gpu_containers, tuple((f.container, f.rule, f.severity.value) for f in p.findings))
        for p in report.pods + report.unread
    ]


def test_the_corpus_is_what_sources_md_lists():
    files = sorted(str(p.relative_to(FLEET)) for p in FLEET.rglob("*.yaml"))
    sources = (FLEET / "SOURCES.md").read_text()
    assert files == sorted(EXPECTED) and len(files) >= 30
    assert len({f.split("/")[0] for f in files}) >= 8
    assert all(f"| {f} |" in sources for f in files)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_fleet_corpus_findings_by_hand(name):
    assert _summary(_read(FLEET / name)) == EXPECTED[name]


def test_the_corpus_totals():
    """The figures of docs/reliability.md's issue-24 sections (before, 7f55d4c: 6 templates, 2 GPU
    containers; 9f9596e: 33 files, 42 templates, 29 GPU containers, 3 GZ007)."""
    reports = [_read(FLEET / name) for name in EXPECTED]
    assert sum(len(r.pods) for r in reports) == 48
    assert sum(len(p.gpu_containers) for r in reports for p in r.pods) == 34
    assert sum(len(r.unread) for r in reports) == 1
    assert not any(f.rule == "GZ001" for r in reports for _, f in r.findings)


# -- GPU forms ------------------------------------------------------------------------------------

DRA_POD = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: one-gpu}
spec: {spec: {devices: {requests: [{name: gpu, exactly: {deviceClassName: gpu.nvidia.com}}]}}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: channel}
spec: {spec: {devices: {requests: [{name: c, exactly: {deviceClassName: compute-domain-default-channel.nvidia.com}}]}}}
---
apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  resourceClaims:
  - {name: gpu, resourceClaimTemplateName: one-gpu}
  - {name: channel, resourceClaimTemplateName: channel}
  - {name: elsewhere, resourceClaimName: made-by-someone-else}
  initContainers:
  - {name: warm, image: i, command: [python, warm.py], resources: {limits: {nvidia.com/gpu.shared: 1}}}
  - {name: side, image: i, restartPolicy: Always, command: [python, s.py], resources: {claims: [{name: gpu}]}}
  containers:
  - {name: train, image: i, command: [python, t.py], resources: {claims: [{name: gpu}]}}
  - {name: imex, image: i, command: [python, t.py], resources: {claims: [{name: channel}]}}
  - {name: other, image: i, command: [python, t.py], resources: {claims: [{name: elsewhere}]}}
"""


def test_gpus_by_dra_claim_shared_resource_init_and_sidecar():
    pods = _read(Path("dra.yaml"), DRA_POD).pods
    forms = {c: [(g.resource.name, g.resource.form) for g in pod.gpus] for c, pod in _containers(pods[0]).items()}
    assert forms == {
        "warm": [("nvidia.com/gpu.shared", GpuForm.SHARED)],
        "side": [("gpu.nvidia.com", GpuForm.DRA)],
        "train": [("gpu.nvidia.com", GpuForm.DRA)],
        "imex": [],  # an IMEX channel is not a GPU
        "other": [("claim elsewhere", GpuForm.DRA_ASSUMED)],  # its claim is not in the input
    }
    assert pods[0].gpu_containers == ("warm", "side", "train", "other")


def _containers(result):
    context = GpuContext(result.ref.annotations, claim_classes(load_documents(DRA_POD)))
    return {c.name: c for c in rules.read(result.ref.spec, context=context).every_container}


def test_a_gpu_device_class_given_on_the_command_line(tmp_path):
    jobset = FLEET / "jobset"
    text = "\n---\n".join(p.read_text() for p in sorted(jobset.glob("*.yaml")))
    (tmp_path / "both.yaml").write_text(text)
    assumed = _read(tmp_path / "both.yaml")  # gpu.example.com is no GPU class by default: no GPU
    assert [p.gpu_containers for p in assumed.pods] == [()]
    given = _read(tmp_path / "both.yaml", classes=GPU_DEVICE_CLASSES | {"gpu.example.com"})
    assert [p.gpu_containers for p in given.pods] == [("worker",)]
    import json
    import sys

    for flags, gpus in [((), 0), (("--gpu-device-class", "gpu.example.com"), 1)]:
        done = subprocess.run(
            [sys.executable, "-m", "gpuzombie", "check", "--json", *flags, str(tmp_path / "both.yaml")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert json.loads(done.stdout)["summary"]["gpu_pods"] == gpus, done.stderr


def test_gpu_requests_no_reader_understood_are_a_finding(tmp_path):
    argo = """
apiVersion: argoproj.io/v1alpha1
kind: Workflow
metadata: {name: w}
spec:
  templates:
  - name: job
    resource:
      action: create
      manifest: |
        apiVersion: batch.volcano.sh/v1alpha1
        kind: Job
        spec:
          tasks:
          - template:
              spec:
                containers:
                - resources:
                    limits:
                      nvidia.com/gpu: 8
"""
    report = _read(tmp_path / "w.yaml", argo)
    assert report.pods == [] and [p.ref.path for p in report.unread] == ["spec.templates[0].resource.manifest"]
    assert "nvidia.com/gpu: 8 in an embedded manifest" in report.unread[0].findings[0].message
    assert report.unread[0].findings[0].severity is rules.Severity.WARNING  # not checked: possible, shown
    assert not report.failed and dataclasses.replace(report, fail_on=rules.Severity.WARNING).failed
    (result,) = report.to_sarif()["runs"][0]["results"]
    assert result["ruleId"] == "GZ007" and result["locations"][0]["physicalLocation"]["region"] == {"startLine": 10}
    assert result["message"]["text"].startswith("Workflow/w spec.templates[0].resource.manifest: nvidia.com/gpu: 8")


# -- shells as they run ------------------------------------------------------------------------------

LAST = "cat /proc/$$/comm"
SCRIPTS = [
    LAST,
    f"true && {LAST}",
    f"false || {LAST}",
    f"set -e; {LAST}",
    f"X=1 {LAST}",
    f"echo 'a & b' >/dev/null; {LAST}",  # the & is quoted: no job
    f"{LAST} # a comment",
    f"sleep 0.1 & {LAST}",
    f"{LAST} | cat",
    f"cd /; {LAST} 2>&1",
    f"trap 'exit 0' TERM; {LAST}",
    f"({LAST})",
]


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("shell", ["bash", "dash"])
def test_which_program_a_shell_leaves_as_itself_matches_the_real_shell(shell, script):
    """Measured: bash 5.2.15 execs a plain last command (no job, no trap, no redirection, no
    pipe, no subshell); dash 0.5.12 never does. The model says which (``sh`` is "it depends")."""
    if shutil.which(shell) is None:
        pytest.skip(f"no {shell}")
    real = subprocess.run([shell, "-c", script], capture_output=True, text=True, timeout=30).stdout.split()[0]
    model = analyse_argv([shell, "-c", script])
    assert (model.program == "cat") == (real == "cat"), (real, model)


@pytest.mark.parametrize(
    ("argv", "program", "background"),
    [
        (["bash", "-c", "--", "ulimit -n 65536; ray start --head --block & wait"], "bash", True),  # KubeRay
        (
            ["/bin/bash", "-lc", "--", "echo 'x & y'; exec python3 -m vllm.entrypoints.openai.api_server"],
            "python3",
            False,
        ),
        (["bash", "-o", "pipefail", "-c", "set -e; exec torchrun train.py"], "torchrun", False),
        (["sh", "-c", 'echo "&"; python train.py'], "sh", False),
    ],
)
def test_bash_dash_dash_options_and_quoted_ampersands(argv, program, background):
    pid1 = analyse_argv(argv)
    assert (pid1.program, pid1.background) == (program, background)


TRAP = "trap 'exit 0' TERM; sleep infinity & wait"


def _spec(*argv: str) -> dict:
    return {
        "containers": [
            {"name": "c", "image": "i", "command": list(argv), "resources": {"limits": {"nvidia.com/gpu": 1}}}
        ]
    }


def test_the_trap_idiom_is_not_gz001_and_exits_on_sigterm_as_pid1():
    findings = rules.check_pod_spec(_spec("bash", "-c", TRAP))
    assert [(f.rule, f.severity) for f in findings] == [("GZ002", rules.Severity.WARNING)]
    assert "traps SIGTERM and exits" in findings[0].message
    with PidNamespace("bash", "-c", TRAP) as ns:  # as PID 1, as in a container
        wait_until(lambda: ns.children())  # the sleep is started, the trap set before it
        pid1 = psutil.Process(ns.pid1)
        os.kill(ns.pid1, signal.SIGTERM)
        wait_until(lambda: not pid1.is_running() or pid1.status() == psutil.STATUS_ZOMBIE, timeout=20)


SERVER = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); time.sleep(60)"
"""A program that handles SIGTERM itself, as vLLM's server does."""


def _catches_sigterm(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status").read_text()
    caught = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught, 16) & (1 << (signal.SIGTERM - 1)))


def test_the_certain_case_drops_sigterm_as_pid1_and_the_possible_one_need_not():
    """GZ008 (error) is what PID 1 does, not a guess: dash as PID 1 of a real PID namespace, its
    program in the foreground, is still there 3 s after SIGTERM (the kubelet would wait the whole
    grace); the same program as PID 1 itself (GZ002, a warning) exits at once on its own handler."""
    if shutil.which("dash") is None:
        pytest.skip("no dash")
    script = f"python3 -c '{SERVER}'"
    (certain,) = rules.check_pod_spec(_spec("dash", "-c", script))
    (possible,) = rules.check_pod_spec(_spec("python3", "-c", SERVER))
    assert (certain.rule, certain.severity, possible.rule, possible.severity) == (
        "GZ008",
        rules.Severity.ERROR,
        "GZ002",
        rules.Severity.WARNING,
    )
    with PidNamespace("dash", "-c", script) as ns:
        wait_until(lambda: ns.children())
        pid1 = psutil.Process(ns.pid1)
        os.kill(ns.pid1, signal.SIGTERM)
        time.sleep(3)
        assert pid1.is_running() and pid1.status() != psutil.STATUS_ZOMBIE  # dropped: the whole grace
    with PidNamespace("python3", "-c", SERVER) as ns:
        pid1 = psutil.Process(ns.pid1)
        wait_until(lambda: _catches_sigterm(ns.pid1))  # its handler set: before it, PID 1 drops SIGTERM too
        os.kill(ns.pid1, signal.SIGTERM)
        wait_until(lambda: not pid1.is_running() or pid1.status() == psutil.STATUS_ZOMBIE, timeout=10)


def test_gz002_says_what_pid1_is_and_never_that_a_program_ignores_sigterm():
    program = rules.check_pod_spec(_spec("python3", "-m", "vllm.entrypoints.openai.api_server"))[0].message
    assert "never gets SIGTERM" not in program and "reaps no orphaned processes" in program
    execd = rules.check_pod_spec(_spec("bash", "-c", "cd /app && torchrun train.py"))[0].message
    assert execd.startswith("PID 1 is torchrun (bash -c 'cd /app && torchrun train.py'), which bash execs")
    (stays,) = rules.check_pod_spec(_spec("sh", "-c", "./setup.sh; python3 serve.py"))
    assert (stays.rule, stays.severity) == ("GZ008", rules.Severity.ERROR)  # certain: dash stays, drops SIGTERM
    assert "where sh is dash" in stays.message and "whole grace (30 s)" in stays.message


def patch_manifests(text: str, policy: object) -> tuple[list[object], list[str]]:
    """``webhook --patch``'s fix of ``text`` (``admission.gitops``, the round trip the CLI writes),
    read back as documents, and its warnings."""
    from gpuzombie.admission.gitops import patch_text

    result = patch_text(text, policy)  # type: ignore[arg-type]
    return [d.data for d in load_documents(result.text)], result.warnings


# -- --patch of templates inside custom resources ------------------------------------------------


def test_patch_fixes_templates_inside_custom_resources_and_is_idempotent():
    from gpuzombie.admission.mutate import Mode, Policy

    policy = Policy(image="registry.example/gpuzombie:1", mode=Mode.MUTATE, skip_namespaces=frozenset())
    for name, pointers in [
        ("lws/sglang_lws.yaml", ["leaderTemplate", "workerTemplate"]),
        ("kai/gpu-sharing_gpu-sharing-init-container.yaml", [""]),
        ("kserve/samples_llmisvc_agentic-tool-calling_llmisvc-single-gpu.yaml", ["template"]),
    ]:
        text = (FLEET / name).read_text()
        patched, _warnings = patch_manifests(text, policy)
        import yaml

        again = yaml.safe_dump_all(patched)
        report = _read(Path(name), again)
        assert report.pods and not any(f.severity is not rules.Severity.NOTE for _, f in report.findings), name
        assert patch_manifests(again, policy)[0] == patched, name  # idempotent
        assert len(pointers) <= len(report.pods)


# -- the live webhook on pods as the operators generate them ----------------------------------------

KUBERAY_HEAD_ARGS = (  # ray-operator/controllers/ray/common/pod.go: command utils.GetContainerCommand
    "ulimit -n ${RAY_START_ULIMIT_OPEN_FILES:-65536}; ray start --head --block --dashboard-host=0.0.0.0 --num-gpus=1"
)
OPERATOR_PODS = [  # (container as the operator writes it, the container's command after the patch)
    pytest.param(
        {"command": ["/bin/bash", "-c", "--"], "args": [KUBERAY_HEAD_ARGS]},
        ["/.gpuzombie/tini-static", "-s", "-g", "--", "/bin/bash", "-c", "--"],
        id="KubeRay head: bash -c --",
    ),
    pytest.param(
        {"command": ["/bin/bash", "-lc", "--"], "args": ["ulimit -n 65536; ray start --block --address=h:6379"]},
        ["/.gpuzombie/tini-static", "-s", "-g", "--", "/bin/bash", "-lc", "--"],
        id="KubeRay worker: bash -lc --",
    ),
    pytest.param({"args": ["--backend", "nccl"]}, None, id="training-operator: args only"),
    pytest.param(
        {"command": ["python3", "-m", "sglang.launch_server", "--model-path", "m"]},
        ["/.gpuzombie/tini-static", "-s", "-g", "--", "python3", "-m", "sglang.launch_server", "--model-path", "m"],
        id="LeaderWorkerSet leader",
    ),
]


@pytest.mark.parametrize(("fields", "command"), OPERATOR_PODS)
def test_the_webhook_patches_operator_pods_as_patch_does_their_templates(fields, command):
    import json

    import yaml

    from admission_requests import admission_review, api_server_pod, container
    from admission_support import apply, patch_of, validate_pod
    from gpuzombie.admission.mutate import Policy
    from gpuzombie.admission.review import review

    policy = Policy(image="registry.example/gpuzombie:1")
    pod = api_server_pod(container("ray-head", **fields))
    answer = review(json.dumps(admission_review(pod)).encode(), policy)
    patched = apply(pod, patch_of(answer.body))
    validate_pod(patched)
    live = patched["spec"]["containers"][0]
    assert live.get("command") == (command or fields.get("command"))
    assert patched["spec"].get("shareProcessNamespace", False) is (command is None)

    template = {
        "metadata": {},
        "spec": {"containers": [{"name": "ray-head", "image": "i", **fields, "resources": GPU}]},
    }
    cluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "r"}}
    cluster["spec"] = {"headGroupSpec": {"template": template}}
    documents, _warnings = patch_manifests(yaml.safe_dump(cluster), policy)
    fixed = documents[0]["spec"]["headGroupSpec"]["template"]["spec"]
    assert fixed["containers"][0].get("command") == live.get("command")
    assert fixed.get("shareProcessNamespace", False) is patched["spec"].get("shareProcessNamespace", False)


GPU = {"limits": {"nvidia.com/gpu": "1"}}


def test_kuberay_pods_say_what_pid1_is():
    spec = {
        "containers": [
            {"name": "h", "command": ["/bin/bash", "-c", "--"], "args": [KUBERAY_HEAD_ARGS], "resources": GPU}
        ]
    }
    (finding,) = rules.check_pod_spec(spec)
    assert finding.rule == "GZ002" and finding.message.startswith("PID 1 is ray (bash -c 'ulimit")
    assert "), which bash execs as its last command, not an init: it reaps no orphaned" in finding.message


def test_patch_resolves_dra_claims_in_its_input():
    """--patch sees the claim templates beside the pod: the IMEX-channel container is left alone."""
    from gpuzombie.admission.mutate import Policy

    documents, _warnings = patch_manifests(DRA_POD, Policy(image="registry.example/gpuzombie:1"))
    commands = {c["name"]: c["command"][0] for c in documents[2]["spec"]["containers"]}
    assert commands == {"train": "/.gpuzombie/tini-static", "imex": "python", "other": "/.gpuzombie/tini-static"}


def test_a_document_past_the_search_bound_is_a_finding(tmp_path, monkeypatch):
    monkeypatch.setattr(
        "gpuzombie.k8s.podspec.templates.MAX_SEARCH_NODES", 50
    )  # the bound's behaviour, on a small input
    items = ",".join("{a: 1}" for _ in range(60))
    report = _read(tmp_path / "big.yaml", f"kind: Big\nmetadata: {{name: b}}\nspec: {{items: [{items}]}}\n")
    (unread,) = report.unread
    assert "not searched to the end" in unread.findings[0].message
    assert dataclasses.replace(report, fail_on=rules.Severity.WARNING).failed


# -- containers standing for a pod: Argo templates, KServe model formats ---------------------------

ARGO_AND_KSERVE = """
apiVersion: argoproj.io/v1alpha1
kind: CronWorkflow
metadata: {name: nightly}
spec:
  schedule: "0 2 * * *"
  workflowSpec:
    entrypoint: train
    templates:
    - name: train
      container:
        image: pytorch/pytorch
        command: [python, train.py]
        resources: {limits: {nvidia.com/gpu: 1}}
    - name: eval
      script:
        image: pytorch/pytorch
        command: [bash]
        source: |
          python serve.py &
          python eval.py
        resources: {limits: {nvidia.com/gpu: 1}}
---
apiVersion: serving.kserve.io/v1beta1
kind: InferenceService
metadata: {name: llm}
spec:
  predictor:
    model:
      modelFormat: {name: huggingface}
      command: [sh, -c, "python -m server & sleep infinity"]
      resources: {limits: {nvidia.com/gpu: 1}}
"""


def test_argo_templates_and_kserve_model_formats_are_read_as_containers(tmp_path):
    """Argo runs a template's command behind argoexec (PID 1: it reaps and forwards signals to the
    process group, an init), so a bash script with a job gets no finding; a KServe model format is
    the ServingRuntime's container (kserve-container) with the manifest's command, when it has one."""
    report = _read(tmp_path / "both.yaml", ARGO_AND_KSERVE)
    assert _summary(report) == [
        ("spec.workflowSpec.templates[0].container", ("main",), PLAIN),
        ("spec.workflowSpec.templates[1].script", ("main",), PLAIN),
        ("spec.predictor.model", ("kserve-container",), (("kserve-container", "GZ001", "error"),)),
    ]
    assert report.unread == []  # their GPUs were read: no GZ007
    templates = list(pod_templates(load_documents(ARGO_AND_KSERVE)))
    (script,) = rules.read(templates[1].spec).every_container
    assert container_pid1(script).program == "argoexec" and "python serve.py &" in script.words[-1]
    (finding,) = report.to_sarif()["runs"][0]["results"]
    assert finding["locations"][0]["physicalLocation"]["region"] == {"startLine": 29}  # model:
    # --patch leaves both alone: Argo's PID 1 is an init, KServe's pod is the operator's to write
    (tmp_path / "both.yaml").write_text(ARGO_AND_KSERVE)
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "gpuzombie", "webhook", "--patch", str(tmp_path / "both.yaml"), "--image", "x/y:1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout == ARGO_AND_KSERVE, done.stderr
