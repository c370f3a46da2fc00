"""The full-screen ``gpuzombie top``: a Textual app over the view model (``top.model``).

Needs the ``top`` extra (Textual); the only module that imports it. Refreshes run in a worker
thread (a slow runtime never freezes the keys); the table is rebuilt from the last frame on every
key, through the model's pure ``arrange``.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from rich.text import Text
from textual import events
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import DataTable, Input, Static

from gpuzombie.errors import GpuzombieError
from gpuzombie.escape import escape
from gpuzombie.top.actions import READ_ONLY, describe_reap, describe_signal
from gpuzombie.top.model import SORT_KEYS, NodeView, PodLine, ProcessLine, arrange, namespaces_of
from gpuzombie.top.render import GRID_COLUMNS, grid_process_row, group_row, header, pod_cells

MIN_WIDTH, MIN_HEIGHT = 60, 10
"""Below this the frame cannot be read: a one-line message instead of a garbled table."""
HELP = """gpuzombie top: keys

  m / z / a / n   sort pods by GPU memory / zombies+orphans / age / name
  /               filter by text (names, PID 1, command lines, a pid); Esc clears
  N               cycle the namespace filter
  t               tree: every pod's processes (Enter: the selected pod's)
  k / K           SIGTERM / SIGKILL the selected process (--allow-actions; asks first)
  r               reap the selected stale pod (--allow-actions; asks first)
  h or ?          this help      q  quit

Signals go through a pidfd pinned to the process that was read: a recycled pid is never signalled."""


@dataclass(frozen=True)
class Actions:
    """What the app calls for an action (None: read-only). Each returns one line for the status bar."""

    signal: Callable[[ProcessLine, signal.Signals], str]
    reap: Callable[[PodLine], str]


class Confirm(ModalScreen[bool]):
    """A question naming exactly what will be signalled: y to go ahead, anything else to cancel."""

    BINDINGS: ClassVar = [
        Binding("y", "answer(True)", "yes"),
        Binding("n", "answer(False)", "no"),
        Binding("escape", "answer(False)", "no"),
    ]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm"):
            yield Static(Text(self.question))
            yield Static(Text("y: yes   n / Esc: no", style="bold"))

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class Help(ModalScreen[None]):
    BINDINGS: ClassVar = [Binding(k, "close", "close") for k in ("escape", "q", "h", "question_mark")]

    def compose(self) -> ComposeResult:
        yield Static(Text(HELP), id="help")

    def action_close(self) -> None:
        self.dismiss(None)


class TopApp(App[None]):
    TITLE = "gpuzombie top"
    AUTO_FOCUS = "#table"
    CSS = """
    #header { height: 1; }
    #status { height: 1; dock: bottom; }
    #warnings { height: auto; max-height: 3; color: $warning; }
    #filter { display: none; }
    #small { display: none; }
    #confirm, #help { width: 90%; height: auto; border: heavy $accent; padding: 1 2; background: $panel; }
    Confirm, Help { align: center middle; }
    """
    BINDINGS: ClassVar = [
        Binding("q", "quit", "quit"),
        *(Binding(by[0], f"sort('{by}')", by, show=False) for by in SORT_KEYS),  # m, z, a, n
        Binding("slash", "filter", "filter"),
        Binding("N", "namespace", "namespace"),
        Binding("t", "tree", "tree"),
        Binding("enter", "expand", "expand", show=False),
        *(Binding(key, f"signal('{sig}')", sig, show=False) for key, sig in (("k", "SIGTERM"), ("K", "SIGKILL"))),
        Binding("r", "reap", "reap", show=False),
        Binding("h,question_mark", "help", "help"),
        Binding("escape", "clear_filter", "clear", show=False),
    ]

    def __init__(
        self, source: Callable[[], NodeView], *, interval: float = 2.0, actions: Actions | None = None
    ) -> None:
        super().__init__()
        self.source = source
        self.interval = interval
        self.actions = actions
        self.view: NodeView | None = None
        self.sort = "memory"
        self.namespace = ""
        self.text = ""
        self.tree_mode = False
        self.expanded: set[str] = set()
        self.rows: dict[str, tuple[PodLine | None, ProcessLine | None]] = {}
        self._cells: dict[str, tuple[Text, ...]] = {}
        """The table's cells by row key, as last drawn."""
        self.status = ""
        self._scan_lock = threading.Lock()
        self._scanning = False
        self._again = False

    def compose(self) -> ComposeResult:
        yield Static(id="header")
        yield Static(id="warnings")
        yield Input(placeholder="filter: a name, a command, a pid (Enter to apply, Esc to clear)", id="filter")
        yield DataTable(id="table", cursor_type="row", zebra_stripes=False)
        yield Static(id="small")
        yield Static(id="status")

    def on_mount(self) -> None:
        table = self.query_one(DataTable)
        for column in GRID_COLUMNS:
            table.add_column(column, key=column)
        self._fit(self.size.width, self.size.height)
        self.refresh_view()
        self.set_interval(self.interval, self.refresh_view)

    # --- data -------------------------------------------------------------------------------

    def refresh_view(self) -> None:
        """Start a scan; while one runs (a runtime slow to answer), one more follows it instead: never
        two at once, which would share the source's trackers and process cache (a thread worker
        cannot be cancelled, so Textual's exclusive workers would run side by side)."""
        with self._scan_lock:
            if self._scanning:
                self._again = True
                return
            self._scanning = True
        self.run_worker(self._load, thread=True, group="scan")

    def _load(self) -> None:
        while True:
            try:
                view = self.source()
            except (OSError, ValueError, GpuzombieError) as exc:  # the procfs went away: say so, keep the last frame
                self.call_from_thread(self._say, f"scan failed: {escape(str(exc), 300)}")
            else:
                self.call_from_thread(self.show, view)
            with self._scan_lock:
                if not self._again:
                    self._scanning = False
                    return
                self._again = False

    def show(self, view: NodeView) -> None:
        self.view = view
        self._draw()

    def _say(self, line: str) -> None:
        self.status = line
        self.query_one("#status", Static).update(Text(line))

    def _draw(self) -> None:
        if self.view is None:
            return
        view = arrange(self.view, sort=self.sort, namespace=self.namespace, text=self.text)
        self.query_one("#header", Static).update(
            header(view, sort=self.sort, namespace=self.namespace, text=self.text, read_only=self.actions is None)
        )
        self.query_one("#warnings", Static).update(Text("\n".join(f"warning: {w}" for w in view.warnings)))
        table = self.query_one(DataTable)
        selected = self._selected_key()
        rows: dict[str, tuple[Text, ...]] = {}
        self.rows = {}
        for group in view.groups:
            rows[f"g:{group.key}"] = group_row(group)
            self.rows[f"g:{group.key}"] = (None, None)
            for pod in group.pods:
                key = f"p:{group.key}:{pod.key}"
                rows[key] = (*pod_cells(pod), Text(""))
                self.rows[key] = (pod, None)
                if self.tree_mode or pod.key in self.expanded:
                    for proc in pod.processes:
                        key = f"x:{group.key}:{pod.key}:{proc.pid}"
                        rows[key] = grid_process_row(proc)
                        self.rows[key] = (pod, proc)
        if list(rows) == list(self._cells):  # the same rows: change only the cells that changed (ages, mostly)
            for key, cells in rows.items():
                for column, old, new in zip(GRID_COLUMNS, self._cells[key], cells):
                    if old != new:
                        table.update_cell(key, column, new, update_width=True)
        else:  # measuring every cell again is the costly part of a redraw
            table.clear()
            for key, cells in rows.items():
                table.add_row(*cells, key=key)
        self._cells = rows
        if selected in self.rows:
            table.move_cursor(row=table.get_row_index(selected))
        if not self.status:
            self._say("h: help  q: quit" + ("" if self.actions else "  (read-only)"))

    def _selected_key(self) -> str | None:
        table = self.query_one(DataTable)
        if not table.row_count:
            return None
        return str(table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value)

    def selected(self) -> tuple[PodLine | None, ProcessLine | None]:
        key = self._selected_key()
        return self.rows.get(key, (None, None)) if key else (None, None)

    # --- size -------------------------------------------------------------------------------

    def on_resize(self, event: events.Resize) -> None:
        self._fit(event.size.width, event.size.height)

    def _fit(self, width: int, height: int) -> None:
        small = width < MIN_WIDTH or height < MIN_HEIGHT
        self.query_one("#small", Static).update(
            Text(f"terminal too small ({width}x{height}): top needs {MIN_WIDTH}x{MIN_HEIGHT}; q quits")
        )
        self.query_one("#small").display = small
        for widget in ("#header", "#warnings", "#table", "#status"):
            self.query_one(widget).display = not small

    # --- keys -------------------------------------------------------------------------------

    def action_sort(self, key: str) -> None:
        if key in SORT_KEYS:
            self.sort = key
            self._draw()

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.display = True
        box.value = self.text
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.text = event.value.strip()
        event.input.display = False
        self.query_one(DataTable).focus()
        self._draw()

    def action_clear_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.display = False
        self.text = ""
        self.query_one(DataTable).focus()
        self._draw()

    def action_namespace(self) -> None:
        if self.view is None:
            return
        choices = ("", *namespaces_of(self.view))
        at = choices.index(self.namespace) if self.namespace in choices else 0
        self.namespace = choices[(at + 1) % len(choices)]
        self._draw()

    def action_tree(self) -> None:
        self.tree_mode = not self.tree_mode
        self._draw()

    def action_expand(self) -> None:
        pod, _ = self.selected()
        if pod is not None:
            self.expanded ^= {pod.key}
            self._draw()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        self.action_expand()

    def action_help(self) -> None:
        self.push_screen(Help())

    def action_signal(self, name: str) -> None:
        pod, proc = self.selected()
        if self.actions is None:
            self._say(READ_ONLY)
            return
        if pod is None or proc is None:
            self._say("select a process first (Enter or t shows a pod's processes)")
            return
        sig = signal.Signals[name]
        actions = self.actions

        def answered(yes: bool | None) -> None:
            self._say(actions.signal(proc, sig) if yes else f"{sig.name} to pid {proc.pid}: cancelled")
            self.refresh_view()

        self.push_screen(Confirm(describe_signal(proc, pod, sig)), answered)

    def action_reap(self) -> None:
        pod, _ = self.selected()
        if self.actions is None:
            self._say(READ_ONLY)
            return
        if pod is None or pod.dirty != "stale":
            self._say("select a stale pod first (MARK STALE)")
            return
        actions = self.actions

        def answered(yes: bool | None) -> None:
            if not yes:
                self._say(f"reap of {pod.label}: cancelled")
                return
            self._say(f"reaping {pod.label} ...")
            self.run_worker(lambda: self.call_from_thread(self._say, actions.reap(pod)), thread=True, group="reap")

        self.push_screen(Confirm(describe_reap(pod)), answered)
