"""DTensor's functional collectives (``torch.distributed._functional_collectives``, tensor
parallelism), recorded without code changes: each returns at once, and its work is awaited by
``wait_tensor`` where the result is first used, so each is an asynchronous op from its issue to
that wait, found again by its result's storage (``works.storage_key``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from laggard.tracer.auto.works import AutoWork, paused, size_of, storage_key

# function -> op type
FUNCTIONAL = {"all_reduce": "all-reduce", "all_gather_tensor": "all-gather", "all_gather_tensor_autograd": "all-gather",
              "reduce_scatter_tensor": "reduce-scatter", "reduce_scatter_tensor_autograd": "reduce-scatter",
              "all_to_all_single": "all-to-all", "all_to_all_single_autograd": "all-to-all"}
MAX_UNWAITED = 4096  # functional collectives issued and not yet awaited, at most


class FunctionalCapture:
    """The functional collectives' wrappers, part of a ``CommCapture`` (its session, tracer, patches)."""

    def __init__(self, capture: Any) -> None:
        self.capture = capture
        self._issued: dict[int, AutoWork] = {}

    def install(self) -> None:
        try:
            import torch.distributed._functional_collectives as funcol
        except ImportError:  # a torch build without them
            return
        for fname, op in FUNCTIONAL.items():
            orig = getattr(funcol, fname, None)
            if orig is not None:
                self.capture.patches.wrap(fname, orig, self._wrapper(op, orig), (funcol,))
        wait = getattr(funcol, "wait_tensor", None)
        if wait is not None:
            self.capture.patches.wrap("wait_tensor", wait, self._wait_wrapper(wait), (funcol,))

    def _label(self, t: Any, group_pos: int, args: tuple, kwargs: dict[str, Any]) -> str:
        """The group of a functional collective, given as a process group, a (mesh, dim), ranks or a
        name (its ``group`` argument, found by the function's signature)."""
        import torch.distributed._functional_collectives as funcol
        import torch.distributed.distributed_c10d as c10d

        group = kwargs.get("group", args[group_pos] if 0 <= group_pos < len(args) else None)
        try:
            name = funcol._resolve_group_name(group, kwargs.get("tag", ""))
            return self.capture.label(t, c10d._resolve_process_group(name))
        except Exception:  # noqa: BLE001 - a group given in a form this torch resolves differently
            return "functional"

    def _wrapper(self, op: str, orig: Callable[..., Any]) -> Callable[..., Any]:
        params = list(inspect.signature(orig).parameters)
        group_pos = params.index("group") if "group" in params else -1

        def functional(*args: Any, **kwargs: Any) -> Any:
            t = self.capture.tracer()
            if t is None:
                return orig(*args, **kwargs)
            label = self._label(t, group_pos, args, kwargs)
            size = size_of(args[0] if args else kwargs.get("self"))
            with paused(self.capture.session.phases):
                rec = t._issue_async(lambda: orig(*args, **kwargs), op, "collective", label, -1, size, -1, AutoWork)
            if not isinstance(rec, AutoWork):
                return rec
            out = rec._work
            if len(self._issued) > MAX_UNWAITED:  # results nobody waited for (their collectives are lost)
                self._issued.clear()
            self._issued[storage_key(getattr(out, "elem", out))] = rec
            return out

        return functional

    def _wait_wrapper(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        session = self.capture.session

        def wait_tensor(tensor: Any) -> Any:
            rec = self._issued.pop(storage_key(tensor), None) if self._issued else None
            t = session.tracer
            if rec is None or t is None or not session.owns_thread():
                return orig(tensor)
            with paused(session.phases):  # what follows the wait depends on the collective
                out = orig(tensor)
                rec._done = True
                t._complete_async(rec)
            return out

        return wait_tensor
