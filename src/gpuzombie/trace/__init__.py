"""The node view (`gpuzombie trace`): GPU processes, /dev/nvidia* holders and zombies mapped to pods."""

from gpuzombie.trace.model import SCHEMA, TraceReport, TraceRow, trace_node
from gpuzombie.trace.render import render_text

__all__ = ["SCHEMA", "TraceReport", "TraceRow", "render_text", "trace_node"]
