"""`gpuzombie webhook --patch --in-place` as a GitOps bot runs it on a pull request (issue 36 items 9
and 11): the real CLI on real files in a real Git repository, with the symbolic links, hard links,
owners, CRLF files, read-only files, a full filesystem and an edit made during the run that a pull
request or a person brings. Each test names what the code before it did."""

from __future__ import annotations

import contextlib
import ctypes
import os
import pathlib
import select
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from markers import needs_root

pytest.importorskip("yaml", reason="PyYAML is in the 'admission' extra")
pytest.importorskip("ruamel.yaml", reason="ruamel.yaml is in the 'admission' extra")

IMAGE = "registry.example.com/gpu-zombie/gpuzombie-node:0.1.0"
POD = """\
apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  containers:
  - name: main
    image: pytorch/pytorch:2.4.0
    command: [python3, train.py]
    resources:
      limits:
        nvidia.com/gpu: 1
"""


def pod(name: str = "trainer") -> str:
    return POD.format(name=name)


def patch_in_place(cwd: pathlib.Path, *paths: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    flags = [arg for path in paths for arg in ("--patch", path)]
    return subprocess.run(
        [sys.executable, "-m", "gpuzombie", "webhook", "--image", IMAGE, "--in-place", *flags],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def git(repo: pathlib.Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=bot", "-c", "user.email=bot@example.com", "-c", "core.autocrlf=false", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def repository(tmp_path: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_bytes(text.encode())
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "base")
    return repo


def skipped_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("gpuzombie webhook: skipped ")]


@pytest.mark.slow
def test_a_pull_requests_symbolic_links_never_take_the_write_out_of_the_checkout(tmp_path):
    """Before (e95cc19): ``x.yaml -> /outside/y.yaml`` and ``d -> /outside``: the target outside the
    checkout rewritten (``patched x.yaml``, ``patched d/y.yaml``), exit 0. Now: never read nor
    written, each link named (exit 1); a link to a file of the checkout is covered (exit 0)."""
    outside = tmp_path / "etc-kubernetes-manifests"
    outside.mkdir()
    (outside / "y.yaml").write_text(pod("static"))
    (outside / "z.yaml").write_text(pod("other"))
    kept = {p.name: (p.read_bytes(), p.stat().st_mtime_ns, p.stat().st_ino) for p in outside.iterdir()}
    repo = repository(tmp_path, {"deploy/trainer.yaml": pod()})
    (repo / "x.yaml").symlink_to(outside / "y.yaml")  # the pull request's links
    (repo / "d").symlink_to(outside)
    (repo / "deploy" / "same.yaml").symlink_to("trainer.yaml")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "pull request")

    for args in [(".",), ("x.yaml",), ("d/y.yaml",), ("d",), ("deploy", "d/z.yaml")]:
        done = patch_in_place(repo, *args)
        assert done.returncode == 1, (args, done.stderr)
        assert "Traceback" not in done.stderr
        assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns, p.stat().st_ino) for p in outside.iterdir()} == kept
    skipped = skipped_lines(patch_in_place(repo, "x.yaml", "d/y.yaml", "d"))
    assert skipped == [
        "gpuzombie webhook: skipped x.yaml: a symbolic link: not followed",
        "gpuzombie webhook: skipped d/y.yaml: a directory on its way, d, is a symbolic link: not followed",
        "gpuzombie webhook: skipped d: a symbolic link: not followed",
    ]
    assert git(repo, "status", "--porcelain") == " M deploy/trainer.yaml\n"  # the checkout's own file, patched
    assert (repo / "deploy" / "same.yaml").is_symlink()
    git(repo, "checkout", "--", ".")
    covered = patch_in_place(repo, "deploy")  # a link to a file of the run: nothing left unfixed
    assert covered.returncode == 0, covered.stderr
    assert skipped_lines(covered) == [
        "gpuzombie webhook: skipped deploy/same.yaml: a symbolic link: not followed "
        "(what it names is patched under its own name)"
    ]
    # printing follows no link out of the tree either: it would print the file it names
    shown = subprocess.run(
        [sys.executable, "-m", "gpuzombie", "webhook", "--image", IMAGE, "--patch", "x.yaml"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 2 and shown.stdout == ""
    assert shown.stderr == "gpuzombie: error: cannot read x.yaml: a symbolic link: not followed\n"


@needs_root
def test_a_directory_swapped_for_a_link_between_read_and_write_is_not_followed(tmp_path, monkeypatch):
    """The walk and the write open each directory with O_NOFOLLOW from its parent: a directory
    replaced by a link while the fix is made is refused (nothing written), not written through."""
    from gpuzombie.admission.inplace import read_tree, write_back

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "p.yaml").write_text(pod())
    repo = tmp_path / "repo"
    (repo / "deploy").mkdir(parents=True)
    (repo / "deploy" / "p.yaml").write_text(pod())
    monkeypatch.chdir(repo)
    (manifest,), skipped = read_tree(["deploy"], (".yaml",), 1 << 20)
    assert skipped == [] and manifest.parts == ("deploy", "p.yaml")
    (repo / "deploy").rename(repo / "was-deploy")
    (repo / "deploy").symlink_to(outside)
    done = write_back([(manifest, "fixed\n")], 1 << 20)
    assert done.written == [] and done.error is not None and "symbolic link" in done.error
    assert (outside / "p.yaml").read_text() == pod() and (repo / "was-deploy" / "p.yaml").read_text() == pod()


@needs_root
def test_the_owner_mode_and_crlf_line_ends_are_kept(tmp_path):
    """Before: 1000:1000 became 0:0; a CRLF file came back all-LF, its diff the whole file (51
    lines added, 12 removed). Now: owner and mode kept, and the CRLF file's diff is the LF file's."""
    lf, crlf = pod("lf"), pod("crlf").replace("\n", "\r\n")
    repo = repository(tmp_path, {"lf.yaml": lf, "crlf.yaml": crlf})
    for name in ("lf.yaml", "crlf.yaml"):
        os.chown(repo / name, 1000, 1000)
        os.chmod(repo / name, 0o640)
    done = patch_in_place(repo, ".")
    assert done.returncode == 0, done.stderr
    for name in ("lf.yaml", "crlf.yaml"):
        st = (repo / name).stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (1000, 1000, 0o640), name
    after = (repo / "crlf.yaml").read_bytes()
    assert after.count(b"\n") == after.count(b"\r\n") > crlf.count("\n")  # CRLF throughout, fix included
    numstat = {line.split("\t")[2]: line.split("\t")[:2] for line in git(repo, "diff", "--numstat").splitlines()}
    assert numstat["crlf.yaml"] == numstat["lf.yaml"] and numstat["lf.yaml"][1] == "1"  # only `command` replaced
    assert after.replace(b"\r\n", b"\n").replace(b"crlf", b"lf") == (repo / "lf.yaml").read_bytes()


@needs_root
def test_read_only_and_hard_linked_files_are_not_written_the_others_are(tmp_path):
    """Before: a 0444 file rewritten anyway; a hard link split (2 links became 1 and 1, the other
    name kept the old text). Now: both named and not written (exit 1), the third file written."""
    repo = repository(tmp_path, {"ro.yaml": pod("ro"), "linked.yaml": pod("linked"), "ok.yaml": pod("ok")})
    os.chmod(repo / "ro.yaml", 0o444)
    os.link(repo / "linked.yaml", tmp_path / "elsewhere.yaml")
    done = patch_in_place(repo, ".")
    assert done.returncode == 1, done.stderr
    assert skipped_lines(done) == [
        "gpuzombie webhook: skipped linked.yaml: has 2 hard links: replacing it would split them, writing into "
        "it would change it under its other names: not written",
        "gpuzombie webhook: skipped ro.yaml: read-only (mode 0444): not written",
    ]
    assert "patched ok.yaml" in done.stderr
    assert git(repo, "status", "--porcelain") == " M ok.yaml\n"
    assert (repo / "linked.yaml").stat().st_nlink == 2 and (tmp_path / "elsewhere.yaml").read_text() == pod("linked")
    assert (repo / "ro.yaml").stat().st_mode & 0o7777 == 0o444


@needs_root
def test_a_file_that_cannot_be_written_leaves_every_file_unchanged(tmp_path):
    """Before: ``a/1.yaml`` patched, then ``cannot write b/2.yaml`` (exit 2) with a/1.yaml already
    changed. Now: every replacement is written first; b's fails on a full filesystem (a real 8 KiB
    tmpfs), so nothing is replaced, and no temporary file is left."""
    repo = repository(tmp_path, {"a/1.yaml": pod("one")})
    full = repo / "b"
    full.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k", "gpuzombie-test", str(full)], check=True)
    try:
        (full / "2.yaml").write_text(pod("two"))
        with contextlib.suppress(OSError), open(full / "filler", "wb") as filler:
            filler.write(b"x" * 65536)
        done = patch_in_place(repo, "a", "b")
        left = sorted(p.name for p in [*full.iterdir(), *(repo / "a").iterdir()])
        two = (full / "2.yaml").read_text()
    finally:
        subprocess.run(["umount", str(full)], check=True)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1] == (
        "gpuzombie: error: cannot write b/2.yaml: No space left on device; nothing was written"
    )
    assert git(repo, "status", "--porcelain") == "" and two == pod("two")
    assert left == ["1.yaml", "2.yaml", "filler"]


IN_CLOSE_NOWRITE = 0x10


@contextlib.contextmanager
def closed_after_reading(path: pathlib.Path) -> Iterator[int]:
    """An inotify descriptor that polls readable once a reader of ``path`` has closed it."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_CLOEXEC)
    assert fd >= 0, os.strerror(ctypes.get_errno())
    try:
        assert libc.inotify_add_watch(fd, bytes(path), IN_CLOSE_NOWRITE) >= 0, os.strerror(ctypes.get_errno())
        yield fd
    finally:
        os.close(fd)


@pytest.mark.slow
def test_an_edit_made_during_the_run_is_not_lost(tmp_path):
    """Before: an edit of ``a.yaml`` made after the run read it (while it fixed ``b.yaml``) was
    overwritten by the fix of the text read before it, exit 0. Now: the file is checked before
    anything is replaced (inode, size, times, content), the run writes nothing and says which file
    changed (exit 2). The run is stopped (SIGSTOP) as soon as it has read b.yaml, then the edit is
    made, so no load can reorder them (the code before still had b.yaml's 300 pods to fix, 1-2 s,
    before it wrote a.yaml)."""
    many = "---\n".join(pod(f"worker-{i}") for i in range(300))
    repo = repository(tmp_path, {"a.yaml": pod("a"), "b.yaml": many})
    argv = [sys.executable, "-m", "gpuzombie", "webhook", "--image", IMAGE, "--in-place", "--patch", "a.yaml"]
    with closed_after_reading(repo / "b.yaml") as watch:
        run = subprocess.Popen(
            [*argv, "--patch", "b.yaml"],
            cwd=repo,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert select.select([watch], [], [], 120)[0], "b.yaml was never read"
            run.send_signal(signal.SIGSTOP)
            edited = pod("a") + "# a person's edit, made while the bot ran\n"
            (repo / "a.yaml").write_text(edited)
            run.send_signal(signal.SIGCONT)
            _out, err = run.communicate(timeout=300)
        finally:
            if run.poll() is None:
                run.kill()
                run.wait()
    assert run.returncode == 2, err
    assert err.splitlines()[-1] == (
        "gpuzombie: error: a.yaml changed since it was read (edited during the run?); nothing was written"
    )
    assert (repo / "a.yaml").read_text() == edited and (repo / "b.yaml").read_text() == many


def test_a_file_that_changed_since_it_was_read_is_never_replaced(tmp_path, monkeypatch):
    """The same check without a race: the library read, the file changed (content, or only its
    size and times put back by hand), then the write-back."""
    from gpuzombie.admission.inplace import read_tree, write_back

    (tmp_path / "a.yaml").write_text(pod("a"))
    monkeypatch.chdir(tmp_path)
    (manifest,), _ = read_tree(["a.yaml"], (".yaml",), 1 << 20)
    st = (tmp_path / "a.yaml").stat()
    (tmp_path / "a.yaml").write_text(pod("b"))  # same size, a different text
    os.utime(tmp_path / "a.yaml", ns=(st.st_atime_ns, st.st_mtime_ns))
    done = write_back([(manifest, "fixed\n")], 1 << 20)
    assert (
        done.written == []
        and done.error == "a.yaml changed since it was read (edited during the run?); nothing was written"
    )
    assert (tmp_path / "a.yaml").read_text() == pod("b") and os.listdir(tmp_path) == ["a.yaml"]


@needs_root
def test_a_file_whose_owner_cannot_be_kept_is_not_written(tmp_path):
    """Run as uid 1000 on a group-writable file of uid 1001: before, it was replaced and became
    1000's (the owner lost); now it is named and not written (exit 1), the owner's own file is."""
    import shutil
    import tempfile

    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) not installed")
    as_user = [setpriv, "--reuid", "1000", "--regid", "1000", "--clear-groups", "--"]
    probe = subprocess.run([*as_user, sys.executable, "-c", "import gpuzombie"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"uid 1000 cannot run {sys.executable} with gpuzombie: {probe.stderr.decode().strip()[-200:]}")
    repo = pathlib.Path(tempfile.mkdtemp(prefix="gpuzombie-owner-"))  # tmp_path's parents are 0700
    try:
        os.chown(repo, 1000, 1000)
        for name, owner in (("theirs.yaml", 1001), ("mine.yaml", 1000)):
            (repo / name).write_text(pod(name.split(".")[0]))
            os.chown(repo / name, owner, 1000)
            os.chmod(repo / name, 0o664)
        done = subprocess.run(
            [*as_user, sys.executable, "-m", "gpuzombie", "webhook", "--image", IMAGE, "--in-place", "--patch", "."],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 1, done.stderr
        assert skipped_lines(done) == [
            "gpuzombie webhook: skipped theirs.yaml: its owner 1001:1000 cannot be kept by uid 1000: not written"
        ]
        assert (repo / "theirs.yaml").read_text() == pod("theirs") and (repo / "theirs.yaml").stat().st_uid == 1001
        assert "gpuzombie-install" in (repo / "mine.yaml").read_text()
        assert sorted(os.listdir(repo)) == ["mine.yaml", "theirs.yaml"]
    finally:
        shutil.rmtree(repo)
