"""A real PID namespace that mounts a hostile tree as its /proc (a FIFO as PID 1's stat, /dev/zero
links, 500 forged zombies with labels it chose) changes nothing in what the exporter reports about
it: the exporter reads the node's own procfs only, never ``/proc/<pid>/root/proc``."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest

pytest.importorskip("prometheus_client", reason="prometheus-client is in the 'exporter' extra")

from prometheus_client.parser import text_string_to_metric_families

from gpuzombie.observe.namespaces import survey
from gpuzombie.proc.procfs import Procfs
from markers import needs_root
from pidns import PidNamespace, wait_until

FORGE = r"""
mount -t tmpfs forged /proc
mkdir -p /proc/1/ns /proc/1/fd
mkfifo /proc/1/stat /proc/1/status
ln -s /dev/zero /proc/stat
ln -s /dev/zero /proc/1/cmdline
i=2
while [ $i -le 501 ]; do
  mkdir /proc/$i
  printf '%s (evil\nlabel) Z 1 %s %s 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 100 0 0 0' $i $i $i > /proc/$i/stat
  printf 'Name:\tevil\nNSpid:\t%s\n' $i > /proc/$i/status
  i=$((i+1))
done
exec sleep 1000
"""


def _judged(inode: int):
    procfs = Procfs("/proc")
    found = [n for n in survey(procfs, procfs.snapshot(now=0), now=0).namespaces if n.inode == inode]
    return found[0] if found else None


def _facts(ns):
    return (ns.pid1.program, ns.pid1.kind, ns.processes, ns.zombies, ns.orphans, ns.grace_risk, ns.unverified)


@needs_root
def test_a_forged_proc_inside_a_namespace_changes_nothing():
    with (
        PidNamespace("sh", "-c", "exec sleep 1000") as control,
        PidNamespace("sh", "-c", FORGE) as forged,
    ):
        for ns in (control, forged):
            wait_until(lambda ns=ns: psutil.Process(ns.pid1).name() == "sleep", timeout=30)
        assert os.path.exists(f"/proc/{forged.pid1}/root/proc/501/stat")  # the forgery is in place
        inodes = [os.stat(f"/proc/{ns.pid1}/ns/pid").st_ino for ns in (control, forged)]
        judged_control, judged_forged = (wait_until(lambda i=i: _judged(i)) for i in inodes)
        assert _facts(judged_forged) == _facts(judged_control)
        assert (judged_forged.pid1.program, judged_forged.processes, judged_forged.zombies) == ("sleep", 1, ())

        run = subprocess.run(
            [sys.executable, "-m", "gpuzombie", "exporter", "--once"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr
        assert "evil" not in run.stdout
        families = {f.name: f for f in text_string_to_metric_families(run.stdout)}
        zombies_by_parent = sum(s.value for s in families["gpuzombie_zombies_by_parent"].samples)
        assert zombies_by_parent < 500
        sleeping_pid1 = [s.value for s in families["gpuzombie_pid1_kinds"].samples if s.labels["kind"] == "non_forking"]
        assert sum(sleeping_pid1) >= 2  # the control and the forger, both as they really are
