"""Small inconsistencies of the CLI, each held by a test (issue 35 (10)): `lab pod` on a binary file,
`--help` texts that pointed at schemas "in the README" (they live in docs/), schema ids of two forms,
label keys of two domains, and `preflight --help` in argparse's style without saying why."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from docs import REPO
from test_check import one_line_error

SCHEMA_ID = re.compile(r"\bgpuzombie\.([a-z]+)/(v?\d+)\b")
ONE_FORM = re.compile(r"gpuzombie\.[a-z]+/\d+")
OLD_IDS_READ = {"gpuzombie.check/v1"}
"""Ids of the old form that a reader still accepts (admission/report.py SCHEMAS_READ)."""


def gpuzombie(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "gpuzombie", *args], input=stdin, capture_output=True, timeout=60, cwd=REPO
    )
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout.decode(), done.stderr.decode())


@pytest.mark.parametrize("how", ["file", "stdin"])
def test_lab_pod_on_a_binary_file_says_so_in_one_line(tmp_path, how):
    """Before: `gpuzombie: internal error: UnicodeDecodeError: 'utf-8' codec can't decode byte 0xf0 …`."""
    binary = bytes(range(256)) * 4
    path = tmp_path / "pod.yaml"
    path.write_bytes(binary)
    done = gpuzombie("lab", "pod", str(path)) if how == "file" else gpuzombie("lab", "pod", "-", stdin=binary)
    line = one_line_error(done)
    assert "internal error" not in line and "UnicodeDecodeError" not in line
    shown = str(path) if how == "file" else "stdin"
    assert f"{shown}: not UTF-8 text (byte 129), so not a Pod manifest" in line


def _src_texts() -> dict[str, str]:
    return {
        str(p.relative_to(REPO)): p.read_text()
        for p in (REPO / "src" / "gpuzombie").rglob("*.py")
        if "_pb2" not in p.name
    }


def test_every_schema_id_has_one_form_and_the_old_one_is_only_read():
    found: dict[str, set[str]] = {}
    for name, text in _src_texts().items():
        for match in SCHEMA_ID.finditer(text):
            found.setdefault(match.group(0), set()).add(name)
    assert "gpuzombie.check/1" in found and len(found) >= 10
    odd = {i: where for i, where in found.items() if not ONE_FORM.fullmatch(i) and i not in OLD_IDS_READ}
    assert odd == {}
    assert found["gpuzombie.check/v1"] == {"src/gpuzombie/admission/report.py"}  # SCHEMAS_READ only
    from gpuzombie.admission import report

    assert report.SCHEMA == "gpuzombie.check/1" and set(report.SCHEMAS_READ) == {"gpuzombie.check/v1", report.SCHEMA}


HELP_PAGES = {
    ("observe",): ("gpuzombie.observe/1", "docs/observe.md"),
    ("trace",): ("gpuzombie.trace/1", "docs/trace.md"),
    ("reap",): ("gpuzombie.reap/1", "docs/reap.md"),
    ("top",): ("gpuzombie.top/1", "docs/top.md"),
    ("prestop",): ("gpuzombie.prestop/1", "docs/prestop.md"),
    ("check",): ("gpuzombie.check/1", "docs/admission.md"),
    ("lab", "pod"): ("gpuzombie.labpod/2", "docs/lab.md"),
    ("preflight",): ("gpuzombie.preflight/1", "docs/handover.md"),
}


@pytest.mark.parametrize("argv", list(HELP_PAGES), ids=" ".join)
def test_help_names_the_schema_and_the_page_that_documents_it(argv):
    schema, page = HELP_PAGES[argv]
    done = gpuzombie(*argv, "--help")
    text = " ".join(done.stdout.split())
    assert done.returncode == 0 and "in the README" not in text
    assert schema in text and page in text, text[-800:]
    assert schema in (REPO / page).read_text()  # the page does document it


def test_the_prestop_hooks_own_help_names_the_schema_too():
    """`python3 -m gpuzombie.prestop` (argparse, stdlib only) is built from the same option table."""
    done = subprocess.run(
        [sys.executable, "-m", "gpuzombie.prestop", "--help"], capture_output=True, text=True, cwd=REPO
    )
    assert "gpuzombie.prestop/1" in " ".join(done.stdout.split()) and "in the README" not in done.stdout


def test_no_help_text_in_the_source_points_at_the_readme_for_a_schema():
    for name, text in _src_texts().items():
        assert "schema in the README" not in text, name


def test_preflight_help_says_why_it_is_argparse():
    done = gpuzombie("preflight", "--help")
    text = " ".join(done.stdout.split())
    assert done.returncode == 0 and text.startswith("usage: gpuzombie preflight")
    assert "This help is argparse's, not click's" in text and "standard library only" in text


LABEL_KEY = re.compile(r"\bgpuzombie\.(io|dev|com|org)/([a-z0-9-]+)")


def test_one_label_and_annotation_domain_the_old_kept_only_as_an_alias():
    """Every annotation gpuzombie reads is gpuzombie.dev/; the experiment chart's scenario label was
    gpuzombie.io/. Now gpuzombie.dev/scenario, with gpuzombie.io/scenario beside it (selectors)."""
    roots = [REPO / "src", REPO / "charts", REPO / "deploy", REPO / "tests" / "fixtures" / "labpod"]
    keys: dict[str, set[str]] = {}
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and path.suffix in (".py", ".yaml", ".yml", ".tpl", ".json", ".txt"):
                for match in LABEL_KEY.finditer(path.read_text(errors="replace")):
                    keys.setdefault(match.group(0), set()).add(str(path.relative_to(REPO)))
    assert {k for k in keys if not k.startswith("gpuzombie.dev/")} == {"gpuzombie.io/scenario"}
    assert keys["gpuzombie.io/scenario"] == keys["gpuzombie.dev/scenario"]  # never one without the other
    for name in keys["gpuzombie.io/scenario"]:
        text = (REPO / name).read_text()
        assert text.count("gpuzombie.dev/scenario") == text.count("gpuzombie.io/scenario"), name


def test_the_domains_are_documented():
    page = (REPO / "docs" / "experiment-chart.md").read_text()
    assert "`gpuzombie.dev/scenario`" in page and "kept as an alias" in page
