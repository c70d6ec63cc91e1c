"""DDP's gradient all-reduce, recorded without code changes.

It runs in C++ inside the backward, past any Python function. A communication hook is the one
Python door into it: a DDP model without a hook of its own gets, before its first forward, the
Python twin of DDP's built-in all-reduce (``allreduce_hook``), which calls the wrapped
``all_reduce``; a hook the user registers is kept and wrapped, so its own calls are recorded the
same way. A built-in C++ hook (``_register_builtin_comm_hook``) stays unseen, with a warning.

DDP's buffer broadcast before each forward (``broadcast_buffers=True``, the default, for a model with
buffers) is C++ too (``dist._broadcast_coalesced``), reached from one Python method; wrapped there, it
is a blocking collective (``DDP_BUFFERS``). Unrecorded, the root's forward would hold its wait for the
last rank to enter the step and read as slow compute on rank 0."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from laggard.errors import LaggardWarning
from laggard.tracer.auto.works import size_of

DDP_GRADS = "grads-all-reduce"  # the op type of DDP's bucketed gradient all-reduce
DDP_BUFFERS = "buffers-broadcast"  # the op type of DDP's module-buffer broadcast before a forward


def install_ddp(capture: Any) -> None:
    """DDP's hook registration and forward patched (into ``capture.patches``) as the module says."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    orig_register, orig_builtin, orig_forward = DDP.register_comm_hook, DDP._register_builtin_comm_hook, DDP.forward
    warned: list[bool] = []

    def register_comm_hook(ddp: Any, state: object, hook: Callable[..., Any]) -> None:
        ddp._laggard_hooked = True
        return orig_register(ddp, state, traced_hook(capture, hook))

    def _register_builtin_comm_hook(ddp: Any, comm_hook_type: Any) -> None:
        ddp._laggard_hooked = True
        if not warned:
            warned.append(True)
            warnings.warn(f"laggard: DDP's built-in {comm_hook_type} communication hook runs in C++: its "
                          "gradient all-reduces are not traced", LaggardWarning, stacklevel=2)
        return orig_builtin(ddp, comm_hook_type)

    def forward(ddp: Any, *args: Any, **kwargs: Any) -> Any:
        if not getattr(ddp, "_laggard_hooked", False):
            ddp._laggard_hooked = True
            if capture.session.tracer is not None:
                orig_register(ddp, ddp.process_group, traced_hook(capture, allreduce_hook))
        return orig_forward(ddp, *args, **kwargs)

    orig_broadcast = getattr(DDP, "_distributed_broadcast_coalesced", None)

    def _distributed_broadcast_coalesced(ddp: Any, tensors: Any, *args: Any, **kwargs: Any) -> Any:
        t = capture.tracer()
        call = lambda: orig_broadcast(ddp, tensors, *args, **kwargs)  # noqa: E731
        if t is None:
            return call()
        size = sum(size_of(x) for x in tensors)
        return capture._blocking(t, call, DDP_BUFFERS, "collective", capture.label(t, ddp.process_group), -1, size)

    wrapped = [("register_comm_hook", register_comm_hook),
               ("_register_builtin_comm_hook", _register_builtin_comm_hook), ("forward", forward)]
    if orig_broadcast is not None:
        wrapped.append(("_distributed_broadcast_coalesced", _distributed_broadcast_coalesced))
    for name, fn in wrapped:
        capture.patches.wrap(name, getattr(DDP, name), fn, (DDP,))


def allreduce_hook(process_group: Any, bucket: Any) -> Any:
    """DDP's built-in all-reduce in Python: the bucket scaled by 1/world size (the built-in multiplies
    each gradient by that factor as it fills the bucket: the same product), then summed."""
    import torch.distributed as dist

    group = process_group if process_group is not None else dist.group.WORLD
    tensor = bucket.buffer()
    tensor.mul_(1.0 / dist.get_world_size(group))
    fut = dist.all_reduce(tensor, group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


def traced_hook(capture: Any, hook: Callable[..., Any]) -> Callable[..., Any]:
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
