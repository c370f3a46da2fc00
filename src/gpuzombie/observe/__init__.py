"""``observe``: PID 1, zombies, orphans, GPU processes, fd holders, orphaned contexts, ghost memory."""

from gpuzombie.observe.model import SCHEMA, ObserveReport, Summary, observe
from gpuzombie.observe.orphans import Orphan, Zombie
from gpuzombie.observe.pid1 import Pid1
from gpuzombie.observe.render import render_text
from gpuzombie.pid1kinds import Pid1Kind

__all__ = ["SCHEMA", "ObserveReport", "Orphan", "Pid1", "Pid1Kind", "Summary", "Zombie", "observe", "render_text"]
