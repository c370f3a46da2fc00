"""`gpuzombie check`: static checks of Kubernetes manifests, the webhook's rules (docs/admission.md)."""

from __future__ import annotations

import json
import os
import pathlib
import stat
import sys
from typing import Any

import click

from gpuzombie.admission.inplace import not_regular
from gpuzombie.cli.common import choice_option, gpu_device_class_option, json_option
from gpuzombie.errors import GpuzombieError, needs_extra
from gpuzombie.escape import escape
from gpuzombie.exitcodes import ExitStatus

SUFFIXES = (".yaml", ".yml", ".json")
MAX_INPUT_BYTES = 64 * 1024 * 1024
CELL_LIMIT = 300
"""A table cell of a name or a place (an object's label, a file and line, a container)."""
MESSAGE_LIMIT = 1000
"""A finding's message in the table (it quotes the container's command)."""


def require_admission_extra(*modules: str) -> None:
    """One line instead of a traceback where the 'admission' extra is not installed."""
    import importlib

    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise GpuzombieError(needs_extra(f"this ({module})", "admission", exc)) from exc


def input_files(paths: tuple[str, ...], refused: list[tuple[str, str]] | None = None) -> list[str]:
    """Each input: ``-`` (stdin), a file, or a directory's YAML and JSON files (sorted, recursively).
    A directory's file that is a symlink to a file outside that directory is not read (a checkout's
    link to ``/etc/…`` or a runner's secret must not become an input): it goes to ``refused`` as
    (path, one line), or without ``refused`` raises GpuzombieError. Named by itself, it is read."""
    out: list[str] = []
    for path in paths or ("-",):
        p = pathlib.Path(path)
        if path != "-" and p.is_dir():
            root = os.path.realpath(p)
            for f in sorted(p.rglob("*")):
                if f.suffix not in SUFFIXES or not f.is_file():
                    continue
                target = os.path.realpath(f)
                if f.is_symlink() and os.path.commonpath([root, target]) != root:
                    why = f"{f}: a symlink to {target}, outside {path}: not read (name it to check it)"
                    if refused is None:
                        raise GpuzombieError(why)
                    refused.append((str(f), why))
                    continue
                out.append(str(f))
        else:
            out.append(path)
    return out


def _read_bounded(path: str) -> bytes:
    """At most MAX_INPUT_BYTES + 1 bytes of a regular file. ``st_size`` is not trusted (0 for
    ``/dev/zero`` and a FIFO, both endless): a file that is not regular is refused without a read,
    and it is opened non-blocking, so a FIFO without a writer does not hang the open."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise GpuzombieError(f"cannot read {path}: {not_regular(mode)}")
        chunks, left = [], MAX_INPUT_BYTES + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_input(path: str) -> str:
    """The text of one input, at most MAX_INPUT_BYTES (new lines as text mode reads them). Raises
    GpuzombieError (exit 2) with one line for what cannot be read: absent, unreadable, not a
    regular file (a FIFO, ``/dev/zero``), over the bound, not UTF-8."""
    shown = "stdin" if path == "-" else path
    try:
        if path == "-" and hasattr(sys.stdin, "buffer"):
            data = sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
        elif path == "-":  # a text stream of a test runner
            data = sys.stdin.read(MAX_INPUT_BYTES + 1).encode()
        else:
            data = _read_bounded(path)
        if len(data) > MAX_INPUT_BYTES:
            raise GpuzombieError(f"{shown}: over {MAX_INPUT_BYTES // 2**20} MiB, not a manifest")
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise GpuzombieError(f"cannot read {shown}: {reason}") from exc
    return text.replace("\r\n", "\n").replace("\r", "\n")


def build_report(
    paths: tuple[str, ...],
    disabled: frozenset[str] = frozenset(),
    fail_on: str = "error",
    gpu_device_classes: tuple[str, ...] = (),
) -> Any:
    """Every input checked; one that cannot be read or understood is recorded, the others still are."""
    require_admission_extra("yaml")
    from gpuzombie.admission.report import CheckReport
    from gpuzombie.admission.rules import Severity
    from gpuzombie.k8s.podspec.gpus import GPU_DEVICE_CLASSES

    report = CheckReport(
        disabled=disabled,
        fail_on=Severity(fail_on),
        gpu_device_classes=GPU_DEVICE_CLASSES | set(gpu_device_classes),
    )
    refused: list[tuple[str, str]] = []
    for path in input_files(paths, refused):
        try:
            text = read_input(path)
        except GpuzombieError as exc:
            report.add_error(path, str(exc))
            continue
        report.add(path, text)
    for path, why in refused:
        report.add_error(path, why)
    return report


def render_table(report: Any) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from gpuzombie.admission.rules import RULES

    console = Console(width=None if sys.stdout.isatty() else 140, highlight=False)
    if report.findings:
        table = Table(header_style="bold", show_lines=True)
        table.add_column("object", overflow="fold", max_width=40)
        table.add_column("container", overflow="fold", max_width=16)
        table.add_column("rule", overflow="fold", max_width=18)
        table.add_column("finding", overflow="fold", ratio=1)
        style = {"error": "bold red", "warning": "yellow", "note": "cyan"}
        for pod in report.pods + report.unread:
            for finding, line, why in pod.results():
                if why is not None:
                    continue
                where = f"{pod.path}:{line or pod.line}" if (line or pod.line) else pod.path
                table.add_row(  # every name is the manifest's (or its file's): escaped, as observe's cells
                    Text.assemble(escape(pod.ref.label, CELL_LIMIT), "\n", (escape(where, CELL_LIMIT), "dim")),
                    Text(escape(finding.container or "", CELL_LIMIT)),  # Text: never rich markup
                    Text.assemble((finding.severity.value, style[finding.severity.value]), f"\n{finding.rule}"),
                    Text(escape(finding.message, MESSAGE_LIMIT)),
                )
        console.print(table)
        for rule_id in sorted({f.rule for _, f in report.findings}):
            rule = RULES[rule_id]
            console.print(Text.assemble((rule_id, "bold"), f" {rule.name}: {rule.summary}."))
            console.print(Text(f"  measured: {rule.evidence}\n  fix: {rule.fix}"))
    counts = report.counts()
    gpu_pods = sum(1 for p in report.pods if p.gpu_containers)
    suppressed = f", {len(report.suppressed)} suppressed by annotation" if report.suppressed else ""
    disabled = f", disabled: {', '.join(sorted(report.disabled))}" if report.disabled else ""
    unread = f"; {len(report.errors)} input(s) not read (exit 2)" if report.errors else ""
    console.print(
        f"{len(report.findings)} finding(s): {counts.get('error', 0)} error(s), {counts.get('warning', 0)} "
        f"warning(s), {counts.get('note', 0)} note(s){suppressed}{disabled} in {len(report.pods)} pod spec(s) "
        f"({gpu_pods} with GPUs) of {len(report.files)} input(s){unread}",
        highlight=False,
    )


def _rule_ids(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> frozenset[str]:
    from gpuzombie.admission.rules import RULES

    named = {v.strip().upper() for value in values for v in value.split(",") if v.strip()}
    unknown = sorted(named - set(RULES))
    if unknown:
        raise click.BadParameter(f"unknown rule {unknown[0]} (the rules: {', '.join(RULES)})")
    return frozenset(named)


@click.command()
@click.argument("paths", nargs=-1, metavar="[FILE|DIR|-]...")
@json_option("gpuzombie.check/1", "docs/admission.md")
@click.option("--sarif", is_flag=True, help="Print SARIF 2.1.0 (code-scanning UIs).")
@click.option(
    "--disable",
    multiple=True,
    callback=_rule_ids,
    metavar="GZ00x",
    help="Do not run this rule (repeatable, or comma-separated). Per object: the annotation "
    "gpuzombie.dev/suppress: 'GZ00x: reason'.",
)
@choice_option(
    "--fail-on",
    ["error", "warning", "note"],
    "error",
    help="The least level that makes the check exit 1: error, certain waste (every deletion holds the GPU "
    "its whole grace); warning, possible waste (it depends on the program); note, cannot tell or advice.",
)
@gpu_device_class_option
def command(
    paths: tuple[str, ...],
    as_json: bool,
    sarif: bool,
    disable: frozenset[str],
    fail_on: str,
    gpu_device_classes: tuple[str, ...],
) -> int:
    """Check Kubernetes manifests for GPU pods that hold their memory after deletion: PID 1 a shell
    or sleep (with background work, or alone: it drops SIGTERM), no init, a preStop that only waits, a
    grace the preStop does not fit in, torchrun's shutdown timeout past the grace. The same rules as
    `gpuzombie webhook`.

    Reads Pods and pod templates wherever they live: the built-in workloads, custom resources (KubeRay,
    Kubeflow, LeaderWorkerSet, JobSet, Volcano, KServe...; docs/admission.md lists them), `kind:
    List`, multi-document YAML or JSON and `helm template` output; a GPU request no reader
    understood is a finding (GZ007). GPUs: device-plugin resources, DRA claims of a GPU device
    class, KAI's gpu-fraction annotation, in init and sidecar containers too. A directory's
    *.yaml, *.yml and *.json files; stdin when no FILE or `-` is given. A container without
    `command` runs its image's ENTRYPOINT, which a manifest does not show: reported as cannot tell.

    A finding is suppressed for one object (and kept, marked, in --json and --sarif) by the
    annotation `gpuzombie.dev/suppress: "GZ002: why; GZ006: why"` on the object or its pod template.

    \b
    Levels (docs/admission.md, "Levels"):
      error    certain waste: the manifest shows every deletion holds the GPU
               its whole grace (sh -c 'python3 -m vllm ...': dash stays PID 1,
               drops SIGTERM); fails by default
      warning  possible waste: it depends on the program (python3 -m vllm as
               PID 1 handles SIGTERM itself, if it has a handler; nothing
               reaps its orphans); fails with --fail-on warning
      note     cannot tell (no command: the image's ENTRYPOINT), or advice

    Exit 0 when nothing at --fail-on or above (by default: no error), 1 with findings at --fail-on
    or above, 2 when an input cannot be read or understood (each named on stderr; every other input
    is still checked and reported).
    """
    if as_json and sarif:
        raise click.UsageError("--json and --sarif are exclusive")
    report = build_report(paths, disable, fail_on, gpu_device_classes)
    if as_json or sarif:
        click.echo(json.dumps(report.to_sarif() if sarif else report.to_dict(), indent=2, ensure_ascii=False))
    else:
        render_table(report)
    for _, message in report.errors:
        click.echo(f"gpuzombie: error: {escape(message)}", err=True)
    if report.errors:
        return int(ExitStatus.ERROR)
    return int(ExitStatus.FINDINGS if report.failed else ExitStatus.OK)
