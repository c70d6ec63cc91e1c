"""A zero-code tracing session: the tracer, the phase hooks and the communication capture of one process.

``autotrace(model, optimizer, out_dir=...)`` traces a training loop you wrote, from hooks on that
model and optimizer; ``install_from_env()`` (what ``laggard run`` starts every rank with) needs no
model at all: it hooks every module's forward (the outermost call is the phase), and creates the
tracer when the script calls ``torch.distributed.init_process_group`` (every rank does, so the
tracer's own start-up collectives line up), or at the first phase of a single-process run.

What it hooks, each undone by ``close()``:

- forward: module forward pre/post hooks (the model's, or every module's for the first steps, then
  those a forward may start from: ``laggard.tracer.auto.forward``), outermost call only;
  one run with grad disabled outside a backward (a validation pass, a frozen teacher) is a
  ``no-grad-forward``, not a training forward (``laggard.tracer.auto.phases``);
- backward: ``torch.autograd.backward`` (``Tensor.backward`` calls it), on the training thread;
- optimizer: torch's global optimizer step pre/post hooks, outermost step only (a wrapper such as
  ZeroRedundancyOptimizer steps its inner optimizer inside its own step); the step's optimizer
  (the one given, or the first outermost one to step) ends each step;
- data: the ``__next__`` of every DataLoader iterator (the wait for a batch);
- communication: ``laggard.tracer.auto.comm``.

A forked child (DataLoader workers) records nothing: the session is switched off there. Only the
thread that created the tracer records, plus autograd's threads while it is in ``backward()``.
"""

from __future__ import annotations

import atexit
import os
import threading
from pathlib import Path
from typing import Any

from laggard.errors import LaggardError
from laggard.tracer.auto import phases as ph
from laggard.tracer.auto.env import DEFAULT_FLUSH_S, read_env
from laggard.tracer.auto.forward import ForwardHooks
from laggard.tracer.auto.works import Patches

_ACTIVE: AutoTrace | None = None  # one session per process: the hooks are global
CAPTURE_META = "autotrace"  # job.json's extra "capture": how the trace was recorded


class AutoTrace:
    """One process's zero-code tracing (see the module docstring). ``tracer`` is None until it exists."""

    def __init__(self, out_dir: str | Path, *, model: Any = None, optimizer: Any = None, name: str | None = None,
                 lazy: bool = False, **tracer_kwargs: Any) -> None:
        global _ACTIVE
        if _ACTIVE is not None:
            raise LaggardError("laggard.autotrace: a session is already active in this process (close it first)")
        self.out_dir = Path(out_dir)
        self.name = name or "job"
        self._tracer_kwargs = tracer_kwargs
        self.tracer: Any = None
        self.phases: ph.Phases | None = None
        self.ddp_hook_depth = 0
        self.in_backward = False
        self._ident = threading.get_ident()
        self._pid = os.getpid()
        # ids of the optimizers inside step() now, outermost first; and of those that stepped inside
        # the outermost one so far
        self._opt_nest: list[int] = []
        self._opt_inner: set[int] = set()
        self._handles: list[Any] = []
        self.forward = ForwardHooks(self)
        self.patches = Patches()  # torch's functions this session replaced (autograd, DataLoader, init)
        self._model, self._optimizer = model, optimizer
        self._closed = False
        from laggard.tracer.auto.comm import CommCapture

        self.capture = CommCapture(self)
        _ACTIVE = self
        try:
            self._install()
            if not lazy:
                self.start_tracer()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ the tracer
    def start_tracer(self) -> Any:
        """Create the tracer now (idempotent): with torch.distributed initialised, on every rank at once."""
        if self.tracer is not None or self._closed:
            return self.tracer
        from laggard.tracer.core import Tracer

        meta = {**self._tracer_kwargs.pop("meta_extra", {}), "capture": CAPTURE_META}
        self._tracer_kwargs.setdefault("timing", _timing())
        self._ident = threading.get_ident()
        tracer = Tracer(self.out_dir, name=self.name, meta_extra=meta, **self._tracer_kwargs)
        self.phases = ph.Phases(tracer)
        self.phases.on_open = self._flush_outside_backward
        self.phases.on_start = self.forward.find_free
        if self._optimizer is not None:
            self.phases.set_step_optimizer(self._optimizer)
        self.tracer = tracer
        return tracer

    def _flush_outside_backward(self) -> None:
        """Communication seen complete joins the segment that starts now, since the training thread
        waited for it meanwhile; inside a backward nothing waits until it returns (DDP's reducer
        waits at the end), so there the backward's end writes them (``_end_backward``)."""
        if not self.in_backward:
            self.capture.flush()

    def owns_thread(self) -> bool:
        return threading.get_ident() == self._ident or self.in_backward

    def _active_tracer(self) -> Any:
        """The tracer a hook records into now, or None (not started, closed, another thread or a child)."""
        t = self.tracer
        if t is None:
            if self._closed or not self._lazy_start_allowed():
                return None
            t = self.start_tracer()
        if not t._enabled or not self.owns_thread():
            return None
        return t

    def _lazy_start_allowed(self) -> bool:
        """A single-process run (no torch.distributed, no launcher saying otherwise) starts at its first phase."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return True
        return int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1

    # ------------------------------------------------------------------ hooks
    def _install(self) -> None:
        import torch
        import torch.optim.optimizer as topt
        from torch.utils.data import dataloader

        self.forward.install(self._model)
        self._handles += [topt.register_optimizer_step_pre_hook(self._optimizer_pre),
                          topt.register_optimizer_step_post_hook(self._optimizer_post)]
        self.patches.wrap("backward", torch.autograd.backward, self._backward_wrapper(torch.autograd.backward),
                          (torch.autograd,))
        it = dataloader._BaseDataLoaderIter
        self.patches.wrap("__next__", it.__next__, self._next_wrapper(it.__next__), (it,))
        self._patch_dist()
        self.capture.install()
        os.register_at_fork(after_in_child=_forked_child)

    def _patch_dist(self) -> None:
        import torch.distributed as dist
        import torch.distributed.distributed_c10d as c10d

        init, destroy = c10d.init_process_group, c10d.destroy_process_group
        session = self

        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            out = init(*args, **kwargs)
            session.start_tracer()  # every rank calls init: the tracer's start-up collectives line up
            return out

        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            if not args and kwargs.get("group") is None:  # the default group goes: nothing to trace after
                session.close()
            return destroy(*args, **kwargs)

        self.patches.wrap("init_process_group", init, init_process_group, (dist, c10d))
        self.patches.wrap("destroy_process_group", destroy, destroy_process_group, (dist, c10d))

    def _backward_wrapper(self, orig: Any) -> Any:
        session = self

        def backward(*args: Any, **kwargs: Any) -> Any:
            t = session._active_tracer()
            if t is None or session.in_backward:
                return orig(*args, **kwargs)
            phases = session.phases
            assert phases is not None
            session.capture.flush()
            phases.push(ph.BACKWARD)
            session.in_backward = True
            try:
                return orig(*args, **kwargs)
            finally:
                session.in_backward = False
                session._end_backward(t, phases)

        backward.__name__, backward.__doc__, backward.__wrapped__ = orig.__name__, orig.__doc__, orig  # type: ignore
        return backward

    def _end_backward(self, t: Any, phases: ph.Phases) -> None:
        """The backward returned. Communication issued inside it (DDP's buckets) has completed: what
        the training thread did after the last issue was waiting for it, then finishing the backward,
        so the last segment is recorded from the last completion on (CPU timing; on GPU the events
        on the stream already show the wait as the stream's)."""
        if phases.top() == ph.BACKWARD and t._cuda is None and self.capture._inflight:
            ctx = phases.drop_segment()
            last = self.capture.flush_timed()
            if ctx is not None:
                if t._gcq:
                    t._drain_gc()
                now = t._clock()
                start = max(ctx._start, last or ctx._start)
                dur = max(0, now - start - (t._excl_ns - ctx._excl0))
                t._rec(ctx._code, ctx._mb, start, dur, -1, None)
                t._excl_ns += dur
        else:
            self.capture.flush()
        phases.pop(ph.BACKWARD)
        phases.backward_done()

    def _optimizer_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.owns_thread():
            return
        nest = self._opt_nest
        if id(optimizer) in nest:
            # taken as left there by a step that raised, whose post hooks never ran: read as nested, it
            # would keep every later step open
            del nest[nest.index(id(optimizer)):]
        nest.append(id(optimizer))
        if len(nest) > 1:  # part of the outer step's phase: a second push would cut that phase's segment
            return
        self._opt_inner.clear()  # a step that raised may have left its inner ones
        if self._active_tracer() is not None:
            self.capture.flush()
            self.phases.push(ph.OPTIMIZER)  # type: ignore[union-attr]

    def _optimizer_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.owns_thread():
            return
        nest = self._opt_nest
        if id(optimizer) in nest:
            depth = nest.index(id(optimizer))
            del nest[depth:]
            if depth:  # inside another optimizer's step: what that one does after this is still the step's
                self._opt_inner.add(id(optimizer))
                return
        inner, self._opt_inner = frozenset(self._opt_inner), set()
        phases = self.phases
        if phases is None or self.tracer is None:
            return
        self.capture.flush()
        phases.pop(ph.OPTIMIZER)
        if phases.optimizer_done(optimizer, inner):
            self.forward.step_ended(phases.step)

    def _next_wrapper(self, orig: Any) -> Any:
        session = self

        def __next__(it: Any) -> Any:
            t = session._active_tracer()
            if t is None or session.phases is None:
                return orig(it)
            phases = session.phases
            phases.pause()
            t0 = t._clock()
            try:
                item = orig(it)
            except StopIteration:
                raise
            else:
                t.record(ph.DATA_WAIT, t0, t._clock() - t0, kind="other")
                return item
            finally:
                phases.resume()

        __next__.__wrapped__ = orig  # type: ignore[attr-defined]
        return __next__

    # ------------------------------------------------------------------ steps
    def end_step(self) -> None:
        """End the step now, as an optimizer's ``step()`` would: for a loop that updates the weights
        itself. A step already ended (by the optimizer) is not ended twice."""
        if self.phases is None or self.tracer is None or not self.owns_thread():
            return
        self.capture.flush()
        self.phases.end_step()

    # ------------------------------------------------------------------ end
    def close(self, status: str = "closed") -> None:
        """Stop tracing, write everything and undo every hook; safe to call twice."""
        global _ACTIVE
        if self._closed:
            return
        self._closed = True
        if self.phases is not None and self.tracer is not None and os.getpid() == self._pid:
            self.capture.flush()
            self.phases.close()
            self.tracer.close(status)
        self.forward.uninstall()
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.capture.uninstall()
        self.patches.undo()
        if _ACTIVE is self:
            _ACTIVE = None

    def __enter__(self) -> AutoTrace:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        self.close("closed" if exc_type is None else f"failed: {exc_type.__name__}")
        return False


def _timing() -> str:
    """CUDA events where the job computes on the GPU: CUDA already in use, or NCCL as the backend (the
    tracer starts at init_process_group, often before the model moves to the GPU); else host clocks."""
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        return "cpu"
    if torch.cuda.is_initialized():
        return "cuda"
    from laggard.tracer.clock import backend_name

    try:
        backend = backend_name() if dist.is_initialized() else ""
    except (RuntimeError, ValueError):
        backend = ""
    return "cuda" if "nccl" in backend else "cpu"


def _forked_child() -> None:
    """In a forked child (a DataLoader worker) the parent's session records nothing."""
    s = _ACTIVE
    if s is not None:
        s._closed = True
        s.tracer = None


def autotrace(model: Any = None, optimizer: Any = None, *, out_dir: str | Path = "trace", name: str = "job",
              **tracer_kwargs: Any) -> AutoTrace:
    """Trace a training loop without naming its ops: forward and backward from hooks on ``model``
    (every module when None; a forward with grad disabled is a ``no-grad-forward``), optimizer steps
    (``optimizer``'s end each step; the first optimizer to step when None; a step nested in another
    optimizer's step is that one's), DataLoader waits, and every torch.distributed collective and
    transfer, DDP's gradient all-reduce included. Call after ``init_process_group`` on every rank; close it (or use
    it as a context manager) at the end. ``tracer_kwargs`` go to ``laggard.tracer.Tracer``."""
    return AutoTrace(out_dir, model=model, optimizer=optimizer, name=name, **tracer_kwargs)


def end_step() -> None:
    """End the training step of this process's zero-code tracing (``laggard run`` or
    ``laggard.autotrace``); nothing when none is active, so a script may call it unconditionally.
    Steps end by themselves at a torch.optim optimizer's ``step()``: this is for a loop that updates
    the weights itself."""
    if _ACTIVE is not None and not _ACTIVE._closed:
        _ACTIVE.end_step()


def install_from_env(environ: dict[str, str] | None = None) -> AutoTrace | None:
    """The session ``laggard run`` asks for through the environment (``laggard.tracer.auto.env``), or
    None when it asks for none. The tracer starts at ``init_process_group`` (or a single process's
    first phase); the session closes at exit."""
    env = read_env(environ)
    if env is None:
        return None
    kwargs: dict[str, Any] = {"flush_interval_s": env.flush_interval_s or DEFAULT_FLUSH_S}
    if env.monitor_url:
        kwargs.update(monitor_url=env.monitor_url, token=env.token)
    rank_dir = Path(env.trace_dir)
    session = AutoTrace(rank_dir, name=env.name, lazy=True, **kwargs)
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        session.start_tracer()
    atexit.register(session.close)
    return session
