"""The node view (`gpuzombie trace`): GPU processes, /dev/nvidia* holders and zombies mapped to pods."""

from gpuzombie.trace.render import render_text
from gpuzombie.trace.report import SCHEMA, TraceReport, TraceRow, trace_node

__all__ = ["SCHEMA", "TraceReport", "TraceRow", "render_text", "trace_node"]
