"""Every collective and point-to-point call torch.distributed makes, recorded without code changes.

Two doors cover what a training program's communication goes through:

- **The functions of ``torch.distributed``** (``all_reduce``, ``all_gather_into_tensor``,
  ``reduce_scatter_tensor``, ``broadcast``, ``barrier``, ``send``/``recv``, ``isend``/``irecv``,
  ``batch_isend_irecv``, the object collectives, ...) are wrapped in place, in both namespaces that
  hold them (``torch.distributed`` and ``torch.distributed.distributed_c10d``, whose own helpers
  call each other through module globals). That covers the user's calls, FSDP2's all-gathers and
  reduce-scatters and pipeline schedules' sends and receives. DTensor's functional collectives
  (``torch.distributed._functional_collectives``, tensor parallelism) are wrapped the same way:
  each is an asynchronous op from its issue to its ``wait_tensor`` (where the result is first
  used), found again by its result's storage. A blocking call is one op; an
  ``async_op=True`` call is an asynchronous op whose end is when its work completes (seen by a
  callback on the work's future, or at ``wait()``, whichever comes first).
- **DDP's gradient all-reduce** runs in C++ inside the backward, past any Python function. A
  communication hook is the one Python door into it: a DDP model without a hook of its own gets,
  before its first forward, the Python twin of DDP's built-in all-reduce (each gradient bucket
  scaled by 1/world size, then summed: the same arithmetic, in the same order), which calls the
  wrapped ``all_reduce``; a hook the user registers is kept and wrapped, so its own calls are
  recorded the same way. A built-in C++ hook (``_register_builtin_comm_hook``) stays unseen, with
  a warning.

A call made inside a communication the tracer records already (``Tracer.all_reduce``, a
``tracer.collective(...)`` block, the set-up collectives of the tracer itself, an object
collective's inner calls) is that op's, never a second one: ``Tracer._comm_depth``.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any

from laggard.errors import LaggardWarning
from laggard.tracer.comm import TracedWork, _InComm, _nbytes

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
# torch.distributed._functional_collectives (DTensor and tensor parallelism): function -> op type; each
# returns at once and its work is awaited by ``wait_tensor`` when the result is first used
FUNCTIONAL = {"all_reduce": "all-reduce", "all_gather_tensor": "all-gather", "all_gather_tensor_autograd": "all-gather",
              "reduce_scatter_tensor": "reduce-scatter", "reduce_scatter_tensor_autograd": "reduce-scatter",
              "all_to_all_single": "all-to-all", "all_to_all_single_autograd": "all-to-all"}
MAX_UNWAITED = 4096  # functional collectives issued and not yet awaited, at most
DDP_GRADS = "grads-all-reduce"  # DDP's bucketed gradient all-reduce (the op type the demo job names it)


class AutoWork(TracedWork):
    """An asynchronous communication captured by zero-code tracing: its end is the completion its
    future reports (from whichever thread completes it), written by the training thread at the
    next phase segment (``CommCapture.flush``), or, for a work without a future, at ``wait()``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._end_ns: int | None = None
        self._ev1: Any = None

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        out = self._work.wait(*args, **kwargs) if self._work is not None else True
        if not self._done:
            self._done = True
            self._tracer._complete_async(self, self._end_ns, self._ev1)
        return out


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
        self._originals: list[tuple[Any, str, Any]] = []
        self._inflight: list[AutoWork] = []
        self._builtin_warned = False

    # ------------------------------------------------------------------ install
    def install(self) -> None:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        for fname, (op, size_arg) in COLLECTIVES.items():
            orig = getattr(c10d, fname, None)
            if orig is None:
                continue
            self._wrap(fname, orig, self._collective_wrapper(_Spec(orig, fname, op, size_arg), orig), (dist, c10d))
        for fname, send in P2P.items():
            orig = getattr(c10d, fname, None)
            if orig is not None:
                spec = _Spec(orig, fname, "send" if send else "recv", "tensor", send=send)
                self._wrap(fname, orig, self._p2p_wrapper(spec, orig, asynchronous=fname.startswith("i")), (dist, c10d))
        orig_batch = getattr(c10d, "batch_isend_irecv", None)
        if orig_batch is not None:
            self._wrap("batch_isend_irecv", orig_batch, self._batch_wrapper(orig_batch), (dist, c10d))
        self._install_ddp()
        self._install_functional()

    def _wrap(self, fname: str, orig: Any, wrapper: Callable[..., Any], namespaces: tuple[Any, ...]) -> None:
        wrapper.__name__ = getattr(orig, "__name__", fname)
        wrapper.__qualname__ = getattr(orig, "__qualname__", fname)
        wrapper.__doc__ = getattr(orig, "__doc__", None)
        wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
        for ns in namespaces:
            if getattr(ns, fname, None) is orig:
                self._originals.append((ns, fname, orig))
                setattr(ns, fname, wrapper)

    def uninstall(self) -> None:
        for ns, fname, orig in reversed(self._originals):
            setattr(ns, fname, orig)
        self._originals.clear()

    # ------------------------------------------------------------------ when to record
    def _tracer(self, *, p2p: bool = False) -> Any:
        """The tracer that records this call, or None to let it through unrecorded. Collectives before
        the first phase are set-up (every rank skips them alike); a transfer is recorded from the
        start (it joins the first step), since a later pipeline stage's first call is the receive that
        matches its predecessor's first send, made after that one's first forward."""
        t = self.session.tracer
        if t is None or not t._enabled or t._skip or t._comm_depth or not self.session.owns_thread():
            return None
        return t if p2p or self.session.phases.started else None

    def _label(self, t: Any, group: Any) -> str:
        import torch.distributed as dist

        if group is None or group is dist.GroupMember.WORLD:
            return "world"
        return t._group_label(group)

    # ------------------------------------------------------------------ collectives
    def _collective_wrapper(self, spec: _Spec, orig: Callable[..., Any]) -> Callable[..., Any]:
        def collective(*args: Any, **kwargs: Any) -> Any:
            t = self._tracer()
            if t is None:
                return orig(*args, **kwargs)
            group = spec.arg(args, kwargs, "group", spec.group_pos)
            size = _size(spec.arg(args, kwargs, spec.size_arg, spec.size_pos)) if spec.size_arg else 0
            label = self._label(t, group)
            name = DDP_GRADS if self.session.ddp_hook_depth and spec.op == "all-reduce" else spec.op
            if spec.arg(args, kwargs, "async_op", spec.async_pos, False):
                return self._issue(t, lambda: orig(*args, **kwargs), name, "collective", label, -1, size)
            return self._blocking(t, lambda: orig(*args, **kwargs), name, "collective", label, -1, size)

        return collective

    def _blocking(self, t: Any, call: Callable[[], Any], name: str, kind: str, label: str, peer: int,
                  size: int) -> Any:
        phases = self.session.phases
        phases.pause()
        try:
            with _InComm(t, t._comm_ctx(name, kind, label, peer, size, -1), name, kind):
                return call()
        finally:
            phases.resume()

    def _issue(self, t: Any, call: Callable[[], Any], name: str, kind: str, label: str, peer: int,
               size: int) -> Any:
        phases = self.session.phases
        phases.pause()  # the compute before the issue ends here: the async op depends on it
        try:
            rec = t._issue_async(call, name, kind, label, peer, size, -1, AutoWork)
        finally:
            phases.resume()
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
            t = self._tracer(p2p=True)
            if t is None:
                return orig(*args, **kwargs)
            group = spec.arg(args, kwargs, "group", spec.group_pos)
            peer = self._global_peer(spec, args, kwargs, group)
            if peer is None:  # a receive from any source: its peer (what matches it) is unknown
                return orig(*args, **kwargs)
            size = _size(spec.arg(args, kwargs, "tensor", spec.size_pos))
            src, dst = (t.rank, peer) if spec.send else (peer, t.rank)
            label = f"p2p:{src}>{dst}"
            if asynchronous:
                return self._issue(t, lambda: orig(*args, **kwargs), spec.op, kind, label, peer, size)
            return self._blocking(t, lambda: orig(*args, **kwargs), spec.op, kind, label, peer, size)

        return p2p

    def _batch_wrapper(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        def batch_isend_irecv(p2p_op_list: list[Any]) -> list[Any]:
            t = self._tracer(p2p=True)
            if t is None:
                return orig(p2p_op_list)
            return self._batch_issue(t, orig, p2p_op_list)

        return batch_isend_irecv

    def _batch_issue(self, t: Any, orig: Callable[..., Any], ops: list[Any]) -> list[Any]:
        phases = self.session.phases
        phases.pause()
        try:
            t._comm_depth += 1
            try:
                works = orig(ops)
            finally:
                t._comm_depth -= 1
            out = []
            for p, w in zip(ops, works, strict=True):
                send = getattr(p.op, "__name__", "") in ("isend", "send")
                peer = int(p.peer) if getattr(p, "peer", None) is not None else None  # a global rank
                if peer is None:
                    out.append(w)
                    continue
                src, dst = (t.rank, peer) if send else (peer, t.rank)
                rec = t._issue_async(lambda w=w: w, "send" if send else "recv", "p2p_send" if send else "p2p_recv",
                                     f"p2p:{src}>{dst}", peer, _size(p.tensor), -1, AutoWork)
                out.append(rec._work if isinstance(rec, AutoWork) and self._watch(t, rec) else rec)
            return out
        finally:
            phases.resume()

    # ------------------------------------------------------------------ functional collectives
    def _install_functional(self) -> None:
        try:
            import torch.distributed._functional_collectives as funcol
        except ImportError:  # a torch build without them
            return
        self._issued: dict[int, AutoWork] = {}
        for fname, op in FUNCTIONAL.items():
            orig = getattr(funcol, fname, None)
            if orig is not None:
                self._wrap(fname, orig, self._functional_wrapper(op, orig), (funcol,))
        wait = getattr(funcol, "wait_tensor", None)
        if wait is not None:
            self._wrap("wait_tensor", wait, self._wait_wrapper(wait), (funcol,))

    def _functional_label(self, t: Any, args: tuple, kwargs: dict[str, Any]) -> str:
        """The group of a functional collective: a process group, a (mesh, dim), ranks or a name."""
        import torch.distributed._functional_collectives as funcol
        import torch.distributed.distributed_c10d as c10d

        group = kwargs.get("group", next((a for a in args[1:] if not isinstance(a, (int, str, type(None)))), None))
        try:
            name = funcol._resolve_group_name(group, kwargs.get("tag", ""))
            return self._label(t, c10d._resolve_process_group(name))
        except Exception:  # noqa: BLE001 - a group given in a form this torch resolves differently
            return "functional"

    def _functional_wrapper(self, op: str, orig: Callable[..., Any]) -> Callable[..., Any]:
        def functional(*args: Any, **kwargs: Any) -> Any:
            t = self._tracer()
            if t is None:
                return orig(*args, **kwargs)
            label = self._functional_label(t, args, kwargs)
            size = _size(args[0] if args else kwargs.get("self"))
            phases = self.session.phases
            phases.pause()
            try:
                rec = t._issue_async(lambda: orig(*args, **kwargs), op, "collective", label, -1, size, -1, AutoWork)
            finally:
                phases.resume()
            if not isinstance(rec, AutoWork):
                return rec
            out = rec._work
            if len(self._issued) > MAX_UNWAITED:  # results nobody waited for (their collectives are lost)
                self._issued.clear()
            self._issued[_storage_key(getattr(out, "elem", out))] = rec
            return out

        return functional

    def _wait_wrapper(self, orig: Callable[..., Any]) -> Callable[..., Any]:
        def wait_tensor(tensor: Any) -> Any:
            rec = self._issued.pop(_storage_key(tensor), None) if self._issued else None
            t = self.session.tracer
            if rec is None or t is None or not self.session.owns_thread():
                return orig(tensor)
            phases = self.session.phases
            phases.pause()  # what follows the wait depends on the collective
            try:
                out = orig(tensor)
                rec._done = True
                t._complete_async(rec)
            finally:
                phases.resume()
            return out

        return wait_tensor

    # ------------------------------------------------------------------ DDP
    def _install_ddp(self) -> None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        capture = self
        orig_register, orig_builtin, orig_forward = DDP.register_comm_hook, DDP._register_builtin_comm_hook, DDP.forward

        def register_comm_hook(ddp: Any, state: object, hook: Callable[..., Any]) -> None:
            ddp._laggard_hooked = True
            return orig_register(ddp, state, _traced_hook(capture, hook))

        def _register_builtin_comm_hook(ddp: Any, comm_hook_type: Any) -> None:
            ddp._laggard_hooked = True
            if not capture._builtin_warned:
                capture._builtin_warned = True
                warnings.warn(f"laggard: DDP's built-in {comm_hook_type} communication hook runs in C++: its "
                              "gradient all-reduces are not traced", LaggardWarning, stacklevel=2)
            return orig_builtin(ddp, comm_hook_type)

        def forward(ddp: Any, *args: Any, **kwargs: Any) -> Any:
            if not getattr(ddp, "_laggard_hooked", False):
                ddp._laggard_hooked = True
                if capture.session.tracer is not None:
                    orig_register(ddp, ddp.process_group, _traced_hook(capture, _allreduce_hook))
            return orig_forward(ddp, *args, **kwargs)

        for name, fn in (("register_comm_hook", register_comm_hook),
                         ("_register_builtin_comm_hook", _register_builtin_comm_hook), ("forward", forward)):
            orig = getattr(DDP, name)
            fn.__name__, fn.__qualname__, fn.__doc__ = orig.__name__, orig.__qualname__, orig.__doc__
            fn.__wrapped__ = orig  # type: ignore[attr-defined]
            self._originals.append((DDP, name, orig))
            setattr(DDP, name, fn)


def _allreduce_hook(process_group: Any, bucket: Any) -> Any:
    """DDP's built-in all-reduce in Python: the bucket scaled by 1/world size (the built-in multiplies
    each gradient by that factor as it fills the bucket: the same product), then summed."""
    import torch.distributed as dist

    group = process_group if process_group is not None else dist.group.WORLD
    tensor = bucket.buffer()
    tensor.mul_(1.0 / dist.get_world_size(group))
    fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def _traced_hook(capture: CommCapture, hook: Callable[..., Any]) -> Callable[..., Any]:
    """A DDP communication hook whose torch.distributed calls are recorded as the gradient all-reduce
    (``DDP_GRADS``); the hook itself is unchanged."""

    def traced(state: object, bucket: Any) -> Any:
        capture.session.ddp_hook_depth += 1
        try:
            return hook(state, bucket)
        finally:
            capture.session.ddp_hook_depth -= 1

    traced.__annotations__ = {}  # DDP checks a hook's annotations against its own types: none is fine
    traced.__qualname__ = getattr(hook, "__qualname__", "hook")
    traced.__name__ = getattr(hook, "__name__", "hook")
    return traced


def _storage_key(x: Any) -> int:
    """What identifies a functional collective's result when it is awaited: the wait may get a view of
    it (DTensor's async tensor re-wraps views), which shares its storage, never its identity."""
    try:
        return int(x.untyped_storage().data_ptr())
    except (AttributeError, RuntimeError, TypeError):
        return id(x)


def _size(x: Any) -> int:
    if x is None:
        return -1
    if isinstance(x, (list, tuple)):
        sizes = [_nbytes(t) for t in x]
        return sum(sizes) if sizes and min(sizes) >= 0 else -1
    return _nbytes(x)
