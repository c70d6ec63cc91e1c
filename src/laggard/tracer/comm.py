"""torch.distributed calls recorded by the tracer: collectives, point-to-point, asynchronous work.

Mixed into ``laggard.tracer.Tracer``; each wrapper takes the arguments torch documents plus
``name=`` (the op type) and ``microbatch=``. torch is imported when a wrapper is first called.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from laggard.errors import LaggardError
from laggard.tracer._page import Side


class TracedWork:
    """An asynchronous communication in flight; ``wait()`` completes and records it."""

    def __init__(self, tracer: Any, code: int, mb: int, aux: tuple, issue_pred: int, step: int | None,
                 ev0: Any = None) -> None:
        self._tracer = tracer
        self._work: Any = None
        self._code = code
        self._mb = mb
        self._aux = aux
        self._issue_pred = issue_pred
        self._step = step
        self._start = tracer._clock() if ev0 is None else 0
        self._ev0 = ev0
        self._done = False

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        out = self._work.wait(*args, **kwargs) if self._work is not None else True
        if not self._done:
            self._done = True
            self._tracer._complete_async(self)
        return out

    def is_completed(self) -> bool:
        return bool(self._work.is_completed()) if self._work is not None else True

    def __getattr__(self, name: str) -> Any:  # anything else a torch Work offers
        return getattr(self._work, name)


class CommMixin:
    """The torch.distributed wrappers of ``Tracer`` (see there for the matching rules)."""

    # torch.distributed wrappers: the call as torch documents it, plus name= and microbatch=
    def all_reduce(self, tensor: Any, op: Any = None, group: Any = None, async_op: bool = False, *,
                   name: str = "all-reduce", microbatch: int = -1) -> Any:
        d = _dist()
        kw = {} if op is None else {"op": op}
        return self._call_collective(lambda: d.all_reduce(tensor, group=group, async_op=async_op, **kw),
                                     name, group, _nbytes(tensor), microbatch, async_op)

    def broadcast(self, tensor: Any, src: int, group: Any = None, async_op: bool = False, *,
                  name: str = "broadcast", microbatch: int = -1) -> Any:
        d = _dist()
        return self._call_collective(lambda: d.broadcast(tensor, src, group=group, async_op=async_op),
                                     name, group, _nbytes(tensor), microbatch, async_op)

    def all_gather_into_tensor(self, output: Any, input: Any, group: Any = None, async_op: bool = False, *,
                               name: str = "all-gather", microbatch: int = -1) -> Any:
        d = _dist()
        return self._call_collective(
            lambda: d.all_gather_into_tensor(output, input, group=group, async_op=async_op),
            name, group, _nbytes(output), microbatch, async_op)

    def reduce_scatter_tensor(self, output: Any, input: Any, op: Any = None, group: Any = None,
                              async_op: bool = False, *, name: str = "reduce-scatter", microbatch: int = -1) -> Any:
        d = _dist()
        kw = {} if op is None else {"op": op}
        return self._call_collective(
            lambda: d.reduce_scatter_tensor(output, input, group=group, async_op=async_op, **kw),
            name, group, _nbytes(input), microbatch, async_op)

    def barrier(self, group: Any = None, *, name: str = "barrier") -> Any:
        d = _dist()
        return self._call_collective(lambda: d.barrier(group=group), name, group, 0, -1, False)

    def send(self, tensor: Any, dst: int, group: Any = None, tag: int = 0, *, name: str = "send",
             microbatch: int = -1) -> None:
        """Blocking send to global rank ``dst``, recorded as a p2p_send op."""
        d = _dist()
        with self.p2p(name, peer=dst, send=True, size_bytes=_nbytes(tensor), microbatch=microbatch):
            d.send(tensor, dst, group=group, tag=tag)

    def recv(self, tensor: Any, src: int, group: Any = None, tag: int = 0, *, name: str = "recv",
             microbatch: int = -1) -> int:
        """Blocking receive from global rank ``src`` (a source is required: it is what matches the send)."""
        if src is None:
            raise LaggardError("Tracer.recv: src is required (a receive from any source cannot be matched)")
        d = _dist()
        with self.p2p(name, peer=src, send=False, size_bytes=_nbytes(tensor), microbatch=microbatch):
            return d.recv(tensor, src, group=group, tag=tag)

    def isend(self, tensor: Any, dst: int, group: Any = None, tag: int = 0, *, name: str = "send",
              microbatch: int = -1) -> Any:
        d = _dist()
        return self._issue_async(lambda: d.isend(tensor, dst, group=group, tag=tag), name, "p2p_send",
                                 f"p2p:{self.rank}>{dst}", dst, _nbytes(tensor), microbatch)

    def irecv(self, tensor: Any, src: int, group: Any = None, tag: int = 0, *, name: str = "recv",
              microbatch: int = -1) -> Any:
        if src is None:
            raise LaggardError("Tracer.irecv: src is required (a receive from any source cannot be matched)")
        d = _dist()
        return self._issue_async(lambda: d.irecv(tensor, src, group=group, tag=tag), name, "p2p_recv",
                                 f"p2p:{src}>{self.rank}", src, _nbytes(tensor), microbatch)

    def batch_isend_irecv(self, p2p_ops: list[Any], *, names: list[str] | None = None,
                          microbatch: int = -1) -> list[Any]:
        """``torch.distributed.batch_isend_irecv`` with each transfer recorded (peers are global ranks)."""
        d = _dist()
        works = d.batch_isend_irecv(p2p_ops)
        if not self._enabled or self._skip:
            return works
        out = []
        for i, (p, w) in enumerate(zip(p2p_ops, works, strict=True)):
            send = "send" in getattr(p.op, "__name__", "")
            nm = names[i] if names else ("send" if send else "recv")
            src, dst = (self.rank, p.peer) if send else (p.peer, self.rank)
            out.append(self._issue_async(lambda w=w: w, nm, "p2p_send" if send else "p2p_recv",
                                         f"p2p:{src}>{dst}", p.peer, _nbytes(p.tensor), microbatch))
        return out

    def _call_collective(self, call: Callable[[], Any], name: str, group: Any, size: int, mb: int,
                         async_op: bool) -> Any:
        if not self._enabled or self._skip:
            return call()
        if async_op:
            return self._issue_async(call, name, "collective", self._group_label(group), -1, size, mb)
        with _InComm(self, self._comm_ctx(name, "collective", self._group_label(group), -1, size, mb), name,
                     "collective"):
            return call()

    def _issue_async(self, call: Callable[[], Any], name: str, kind: str, label: str, peer: int, size: int,
                     mb: int, work_cls: type[TracedWork] = TracedWork) -> Any:
        if not self._enabled or self._skip:
            return call()
        if self._gcq:
            self._drain_gc()
        aux = self._comm_aux(label, peer, size)
        ev0 = None
        if self._cuda is not None:
            ev0 = self._cuda.record()
        work = work_cls(self, self._code(name, kind, "async"), mb, aux, self._last_op(),
                        self._step if self._in_step else None, ev0)
        self._comm_depth += 1  # the call is this op: zero-code capture (tracer.auto) leaves it alone
        try:
            work._work = call()
        finally:
            self._comm_depth -= 1
        return work

    def _complete_async(self, w: TracedWork, end_ns: int | None = None, ev1: Any = None) -> None:
        """Record ``w`` as completed now, or at ``end_ns`` (CUDA: at event ``ev1``) when its completion
        was seen earlier, e.g. by a callback on its future."""
        if not self._enabled:
            return
        deps = [w._issue_pred] if w._issue_pred >= 0 else []
        aux = (*w._aux[:4], Side(replace_chain=True, deps=deps))
        if self._cuda is not None:
            if ev1 is None:
                ev1 = self._cuda.record()
            self._cuda.add(w._step, w._code, w._mb, -1, aux, w._ev0, ev1)
            return
        end = self._clock() if end_ns is None else end_ns
        joins, self._joins = self._joins, []  # pending joins belong to the next op on the stream
        oid = self._write_in(w._step, (w._code, w._mb, w._start, end - w._start, -1, aux))
        self._joins = joins
        if oid >= 0 and self._in_step and w._step == self._step:
            self._joins.append(oid)
        self._room = self._cap if self._in_step and not self._joins and self._bstep == self._step else 0

    def _join(self, aux: tuple | None) -> tuple:
        deps = list(self._joins)
        self._joins.clear()
        if aux is None or not isinstance(aux[4], Side):
            side = Side(deps=deps)
            return (-1, -1, -1, -1, side) if aux is None else (*aux[:4], side)
        s = aux[4]
        s.deps = (s.deps or []) + deps
        return aux

    def _last_op(self) -> int:
        """The local id of the last op on the stream chain in this step (the issue point of an async op)."""
        if not self._in_step or self._page is None:
            return -1
        for i in range(self._n - 1, -1, -1):
            row_step = next(st for b, st in reversed(self._bounds) if b <= i)
            if row_step != self._step:
                return -1
            a = int(self._page[i]["aux"])
            side = int(self._aux[a]["side"]) if a >= 0 and self._aux is not None else -1
            if side < 0 or not self._side[side].replace_chain:
                return self._first_op + i
        return -1

    def _group_label(self, group: Any) -> str:
        if group is None:
            return "world"
        key = id(group)
        label = self._pg_labels.get(key)
        if label is None:
            ranks = _dist().get_process_group_ranks(group)
            label = self._pg_labels[key] = "pg:" + ",".join(str(r) for r in sorted(ranks))
        return label



class _InComm:
    """Around a blocking communication call: the tracer's ``_in_comm`` says which one the main
    thread is in (read by the stream thread's heartbeat and hang report: ``laggard.tracer.flight``),
    with the group's call count (every member numbers its calls of a group alike)."""

    __slots__ = ("_t", "_ctx", "_name", "_kind")

    def __init__(self, t: Any, ctx: Any, name: str, kind: str) -> None:
        self._t, self._ctx, self._name, self._kind = t, ctx, name, kind

    def __enter__(self) -> Any:
        t, aux = self._t, getattr(self._ctx, "_aux", None)
        t._comm_depth += 1  # the torch.distributed calls inside are this op: zero-code capture leaves them alone
        if aux is not None:
            label = t._groups[aux[2]]
            t._in_comm = {"name": self._name, "kind": self._kind, "group": label, "seq": t._ncalls.get(aux[2], 0),
                          "step": t._step, "peer": int(aux[3]), "start_unix_ns": t.now_ns()}
        return self._ctx.__enter__()

    def __exit__(self, *exc: object) -> bool:
        t, cur = self._t, self._t._in_comm
        t._in_comm = None
        t._comm_depth -= 1
        if cur is not None:
            t._comm_last[cur["group"]] = self._name
        if exc[0] is not None and t._stream is not None:  # a peer that aborted on a hang verdict?
            t._stream.hold_for_abort()
        return bool(self._ctx.__exit__(*exc))


def _dist() -> Any:
    import torch.distributed as dist

    return dist


def _nbytes(t: Any) -> int:
    try:
        return int(t.numel() * t.element_size())
    except AttributeError:
        return -1


