"""Every collective and point-to-point call torch.distributed makes, recorded without code changes.

Two doors cover what a training program's communication goes through:

- **The functions of ``torch.distributed``** (``all_reduce``, ``all_gather_into_tensor``,
  ``reduce_scatter_tensor``, ``broadcast``, ``barrier``, ``send``/``recv``, ``isend``/``irecv``,
  ``batch_isend_irecv``, the object collectives, ...) are wrapped in place, in both namespaces that
  hold them (``torch.distributed`` and ``torch.distributed.distributed_c10d``, whose own helpers
  call each other through module globals). That covers the user's calls, FSDP2's all-gathers and
  reduce-scatters and pipeline schedules' sends and receives. A blocking call is one op; an
  ``async_op=True`` call is an asynchronous op whose end is when its work completes (seen by a
  callback on the work's future, or at ``wait()``, whichever comes first). DTensor's functional
  collectives are wrapped the same way (``laggard.tracer.auto.functional``).
- **DDP's gradient all-reduce** runs in C++ inside the backward; a communication hook is the one
  Python door into it (``laggard.tracer.auto.ddp``).

A call made inside a communication the tracer records already (``Tracer.all_reduce``, a
``tracer.collective(...)`` block, the set-up collectives of the tracer itself, an object
collective's inner calls) is that op's, never a second one: ``Tracer._comm_depth``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from laggard.tracer.auto.ddp import DDP_GRADS, install_ddp
from laggard.tracer.auto.functional import FunctionalCapture
from laggard.tracer.auto.works import AutoWork, Patches, paused, size_of
from laggard.tracer.comm import _InComm

# torch.distributed function -> (op type, kind, the argument whose size is the transfer's)
COLLECTIVES: dict[str, tuple[str, str]] = {
    "all_reduce": ("all-reduce", "tensor"),
    "all_reduce_coalesced": ("all-reduce", "tensors"),
    "broadcast": ("broadcast", "tensor"),
    "reduce": ("reduce", "tensor"),
    "all_gather": ("all-gather", "tensor"),
    "all_gather_into_tensor": ("all-gather", "output_tensor"),
    "_all_gather_base": ("all-gather", "output_tensor"),
    "all_gather_coalesced": ("all-gather", "input_tensor_list"),
    "all_gather_single": ("all-gather", "output_tensor"),
    "reduce_scatter_single": ("reduce-scatter", "input"),
    "reduce_scatter": ("reduce-scatter", "input_list"),
    "reduce_scatter_tensor": ("reduce-scatter", "input"),
    "_reduce_scatter_base": ("reduce-scatter", "input"),
    "all_to_all_single": ("all-to-all", "input"),
    "all_to_all": ("all-to-all", "input_tensor_list"),
    "gather": ("gather", "tensor"),
    "scatter": ("scatter", "tensor"),
    "barrier": ("barrier", ""),
    "monitored_barrier": ("barrier", ""),
    "all_gather_object": ("all-gather-object", ""),
    "broadcast_object_list": ("broadcast-object", ""),
    "gather_object": ("gather-object", ""),
    "scatter_object_list": ("scatter-object", ""),
}
P2P = {"send": True, "recv": False, "isend": True, "irecv": False}


class _Spec:
    """Where a wrapped function's arguments are, found once from its signature (binding a
    signature on every call costs microseconds)."""

    __slots__ = ("name", "op", "size_arg", "size_pos", "group_pos", "async_pos", "peer_arg", "peer_pos",
                 "group_peer_arg", "group_peer_pos", "send")

    def __init__(self, fn: Callable[..., Any], name: str, op: str, size_arg: str, *, send: bool | None = None):
        params = list(inspect.signature(fn).parameters)

        def pos(arg: str) -> int:
            return params.index(arg) if arg in params else -1

        self.name, self.op, self.send = name, op, send
        self.size_arg, self.size_pos = size_arg, pos(size_arg) if size_arg else -1
        self.group_pos, self.async_pos = pos("group"), pos("async_op")
        self.peer_arg = "dst" if send else "src"
        self.peer_pos = pos(self.peer_arg)
        self.group_peer_arg = "group_dst" if send else "group_src"
        self.group_peer_pos = pos(self.group_peer_arg)

    @staticmethod
    def arg(args: tuple, kwargs: dict[str, Any], name: str, pos: int, default: Any = None) -> Any:
        if name in kwargs:
            return kwargs[name]
        return args[pos] if 0 <= pos < len(args) else default


class CommCapture:
    """The wrappers, installed into torch.distributed while a zero-code session is active."""

    def __init__(self, session: Any) -> None:
        self.session = session  # laggard.tracer.auto.session.AutoTrace: its tracer and phases
        self.patches = Patches()
        self._inflight: list[AutoWork] = []
        self.functional = FunctionalCapture(self)

    # ------------------------------------------------------------------ install
    def install(self) -> None:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        for fname, (op, size_arg) in COLLECTIVES.items():
            orig = getattr(c10d, fname, None)
            if orig is None:
                continue
            self.patches.wrap(fname, orig, self._collective_wrapper(_Spec(orig, fname, op, size_arg), orig),
                              (dist, c10d))
        for fname, send in P2P.items():
            orig = getattr(c10d, fname, None)
            if orig is not None:
                spec = _Spec(orig, fname, "send" if send else "recv", "tensor", send=send)
                self.patches.wrap(fname, orig, self._p2p_wrapper(spec, orig, asynchronous=fname.startswith("i")),
                                  (dist, c10d))
        orig_batch = getattr(c10d, "batch_isend_irecv", None)
        if orig_batch is not None:
            self.patches.wrap("batch_isend_irecv", orig_batch, self._batch_wrapper(orig_batch), (dist, c10d))
        install_ddp(self)
        self.functional.install()

    def uninstall(self) -> None:
        self.patches.undo()

    # ------------------------------------------------------------------ when to record
    def tracer(self, *, p2p: bool = False) -> Any:
        """The tracer that records this call, or None to let it through unrecorded. Collectives before
        the first phase are set-up (every rank skips them alike); a transfer is recorded from the
        start (it joins the first step), since a later pipeline stage's first call is the receive that
        matches its predecessor's first send, made after that one's first forward."""
        t = self.session.tracer
        if t is None or not t._enabled or t._skip or t._comm_depth or not self.session.owns_thread():
            return None
        return t if p2p or self.session.phases.started else None

    def label(self, t: Any, group: Any) -> str:
        import torch.distributed as dist

        if group is None or group is dist.GroupMember.WORLD:
            return "world"
        return t._group_label(group)

    # ------------------------------------------------------------------ collectives
    def _collective_wrapper(self, spec: _Spec, orig: Callable[..., Any]) -> Callable[..., Any]:
        def collective(*args: Any, **kwargs: Any) -> Any:
            t = self.tracer()
            if t is None:
                return orig(*args, **kwargs)
            group = spec.arg(args, kwargs, "group", spec.group_pos)
            size = size_of(spec.arg(args, kwargs, spec.size_arg, spec.size_pos)) if spec.size_arg else 0
            label = self.label(t, group)
            name = DDP_GRADS if self.session.ddp_hook_depth and spec.op == "all-reduce" else spec.op
            if spec.arg(args, kwargs, "async_op", spec.async_pos, False):
                return self._issue(t, lambda: orig(*args, **kwargs), name, "collective", label, -1, size)
            return self._blocking(t, lambda: orig(*args, **kwargs), name, "collective", label, -1, size)

        return collective

    def _blocking(self, t: Any, call: Callable[[], Any], name: str, kind: str, label: str, peer: int,
                  size: int) -> Any:
        with paused(self.session.phases), _InComm(t, t._comm_ctx(name, kind, label, peer, size, -1), name, kind):
            return call()

    def _issue(self, t: Any, call: Callable[[], Any], name: str, kind: str, label: str, peer: int,
               size: int) -> Any:
        with paused(self.session.phases):
            rec = t._issue_async(call, name, kind, label, peer, size, -1, AutoWork)
        if not isinstance(rec, AutoWork):
            return rec
        return rec._work if self._watch(t, rec) else rec

    def _watch(self, t: Any, rec: AutoWork) -> bool:
        """Date the work's completion from its future (gloo's and NCCL's collectives have one): the
        program then gets torch's own work object back (FSDP checks its type). True when watched;
        False for a work without a future (gloo's point-to-point), which the program gets wrapped,
        its completion seen at ``wait()``."""
        inner = rec._work
        try:
            fut = inner.get_future() if inner is not None else None
        except RuntimeError:
            return False
        if fut is None:
            return False
        cuda, clock = t._cuda, t._clock

        def done(f: Any) -> None:
            if cuda is not None:  # runs on a stream synchronised with the work: its end on the GPU
                rec._ev1 = cuda.record()
            rec._end_ns = clock()

        try:
            fut.then(done)
        except RuntimeError:
            return False
        self._inflight.append(rec)
        return True

    def flush(self) -> int:
        """Write the asynchronous works whose completion has been seen and that nobody waited for
        (DDP waits on their futures): they join the next op. Returns how many were written; on the
        training thread, at phase boundaries."""
        t = self.session.tracer
        if t is None or not self._inflight:
            return 0
        keep, n = [], 0
        for w in self._inflight:
            if w._done:
                continue
            if w._end_ns is None:
                keep.append(w)
                continue
            w._done = True
            t._complete_async(w, w._end_ns, w._ev1)
            n += 1
        self._inflight = keep
        return n

    def flush_timed(self) -> int | None:
        """``flush``, returning the latest completion time it wrote (None when it wrote none)."""
        ends = [w._end_ns for w in self._inflight if not w._done and w._end_ns is not None]
        return max(ends) if self.flush() and ends else None

    # ------------------------------------------------------------------ point-to-point
    def _global_peer(self, spec: _Spec, args: tuple, kwargs: dict[str, Any], group: Any) -> int | None:
        import torch.distributed as dist

        peer = spec.arg(args, kwargs, spec.peer_arg, spec.peer_pos)
        if peer is None:
            gpeer = spec.arg(args, kwargs, spec.group_peer_arg, spec.group_peer_pos)
            if gpeer is not None:
                peer = dist.get_global_rank(group, gpeer) if group is not None else gpeer
        return None if peer is None else int(peer)

    def _p2p_wrapper(self, spec: _Spec, orig: Callable[..., Any], *, asynchronous: bool) -> Callable[..., Any]:
        kind = "p2p_send" if spec.send else "p2p_recv"

        def p2p(*args: Any, **kwargs: Any) -> Any:
            t = self.tracer(p2p=True)
            if t is None:
                return orig(*args, **kwargs)
            group = spec.arg(args, kwargs, "group", spec.group_pos)
            peer = self._global_peer(spec, args, kwargs, group)
            if peer is None:  # a receive from any source: its peer (what matches it) is unknown
                return orig(*args, **kwargs)
            size = size_of(spec.arg(args, kwargs, "tensor", spec.size_pos))
            src, dst = (t.rank, peer) if spec.send else (peer, t.rank)
            label = f"p2p:{src}>{dst}"
            if asynchronous:
                return self._issue(t, lambda: orig(*args, **kwargs), spec.op, kind, label, peer, size)
            return self._blocking(t, lambda: orig(*args, **kwargs), spec.op, kind, label, peer, size)

        return p2p

    def _batch_wrapper(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        def batch_isend_irecv(p2p_op_list: list[Any]) -> list[Any]:
            t = self.tracer(p2p=True)
            if t is None:
                return orig(p2p_op_list)
            return self._batch_issue(t, orig, p2p_op_list)

        return batch_isend_irecv

    def _batch_issue(self, t: Any, orig: Callable[..., Any], ops: list[Any]) -> list[Any]:
        with paused(self.session.phases):
            t._comm_depth += 1
            try:
                works = orig(ops)
            finally:
                t._comm_depth -= 1
            return [self._batch_part(t, p, w) for p, w in zip(ops, works, strict=True)]

    def _batch_part(self, t: Any, p: Any, w: Any) -> Any:
        """One transfer of a batch, recorded as its own asynchronous op (its work as torch returned it)."""
        send = getattr(p.op, "__name__", "") in ("isend", "send")
        peer = int(p.peer) if getattr(p, "peer", None) is not None else None  # a global rank
        if peer is None:
            return w
        src, dst = (t.rank, peer) if send else (peer, t.rank)
        rec = t._issue_async(lambda: w, "send" if send else "recv", "p2p_send" if send else "p2p_recv",
                             f"p2p:{src}>{dst}", peer, size_of(p.tensor), -1, AutoWork)
        return rec._work if isinstance(rec, AutoWork) and self._watch(t, rec) else rec
