"""The torch side of a clean stop, touched only when the training script already imported torch.

``abort_process_group`` is what a dead peer requires: ``destroy_process_group()`` waits for
collectives that will never finish, while an abort (``_abort_process_group``, torch >= 2.3; else
each backend's ``abort()``) tears the communicators down at once, and from any thread, so it also
unblocks a main thread stuck in a collective.
"""

from __future__ import annotations

import gc
import sys
import threading
from typing import Any


def _torch() -> Any | None:
    return sys.modules.get("torch")


def dist_initialized() -> bool:
    torch = _torch()
    if torch is None:
        return False
    try:
        return bool(torch.distributed.is_available() and torch.distributed.is_initialized())
    except Exception:
        return False


_abort_lock = threading.Lock()
_aborted: str | None = None


def abort_process_group() -> str:
    """Abort every process group without waiting for peers, once (the peer monitor and the main
    thread may both ask); says what it did."""
    global _aborted
    with _abort_lock:
        if _aborted is None:
            _aborted = _abort_once()
            return _aborted
        return f"already {_aborted}"


def _abort_once() -> str:
    torch = _torch()
    if torch is None or not dist_initialized():
        return "no process group"
    c10d = torch.distributed.distributed_c10d
    try:
        if hasattr(c10d, "_abort_process_group"):
            c10d._abort_process_group()
            return "aborted (_abort_process_group)"
        pg = c10d._get_default_group()
        pg.abort()
        return "aborted (ProcessGroup.abort)"
    except Exception as exc:  # gloo has no abort in some versions: destroy, which does not wait there
        try:
            torch.distributed.destroy_process_group()
            return f"destroyed (abort failed: {type(exc).__name__}: {exc})"
        except Exception as exc2:
            return f"abort and destroy failed: {exc2}"


def destroy_process_group() -> str:
    if not dist_initialized():
        return "no process group"
    torch = _torch()
    assert torch is not None  # dist_initialized() said so
    try:
        torch.distributed.destroy_process_group()
        return "destroyed"
    except Exception as exc:
        return f"destroy failed: {exc}"


def free_cuda_memory() -> str:
    """Collect garbage and hand cached CUDA blocks back to the driver."""
    gc.collect()
    torch = _torch()
    if torch is None:
        return "torch not imported"
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
            return "cuda cache emptied"
    except Exception as exc:
        return f"empty_cache failed: {exc}"
    return "cuda not initialised"


def default_store() -> Any | None:
    """The default process group's store (for the peer heartbeat), or None."""
    torch = _torch()
    if torch is None or not dist_initialized():
        return None
    try:
        return torch.distributed.distributed_c10d._get_default_store()
    except Exception:
        return None


def dedicated_store_client(host: str, port: int, timeout_s: float) -> Any | None:
    """A second TCPStore client, so heartbeats never queue behind the process group's own calls."""
    torch = _torch()
    if torch is None:
        return None
    from datetime import timedelta

    try:
        return torch.distributed.TCPStore(
            host, port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=timeout_s)
        )
    except Exception:
        return None
