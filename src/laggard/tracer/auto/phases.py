"""The training phases of one rank, from hooks: forward, backward, optimizer step and data wait.

A rank's main thread is in at most one phase at a time, but phases nest: Lightning and closure
optimizers (LBFGS) run the forward and backward *inside* ``optimizer.step``, activation
checkpointing runs a forward inside the backward. So the phases form a stack; the phase on top
owns the time, and each push or pop ends the segment of the phase below and starts a new one
(a phase is recorded as one op per uninterrupted segment, all under the phase's op type).
Communication does the same (``pause``/``resume``): a collective issued inside the backward (DDP's
gradient buckets, FSDP's reduce-scatter) or the forward (tensor-parallel all-reduces) ends the
compute segment before it, so the replay sees the compute and the wait as what they are.

Phases: ``FORWARD`` (an outermost module call with grad enabled, or one inside a backward: there
it is activation checkpointing's recompute of a training forward), ``NO_GRAD_FORWARD`` (an
outermost module call with grad disabled outside a backward: a validation pass, a frozen teacher;
the analysis takes one op type for one computation on every rank and step, so these must not pool
with the training forwards), ``BACKWARD``, ``OPTIMIZER`` and ``DATA_WAIT``.

Steps: a step starts with its first phase and ends when the step's optimizer (the first one to step,
or the one given) finishes ``step()``. Only an outermost optimizer step counts: a wrapper
(ZeroRedundancyOptimizer, Lookahead) runs its inner optimizer's ``step()`` inside its own, and its
work after the inner step (ZeRO's parameter broadcasts) belongs to the step; several independent
optimizers stepping one after another (a GAN's) are each outermost, and the first one ends the step.
A loop that updates the weights itself, with no optimizer, ends its steps with
``laggard.end_step()``; without it its one open step is taken back at the end (below), and the
rank's state says so (``no_step_ended``), so the trace is not an unexplained empty one. What is
recorded between steps (the next batch's data wait, a logging all-reduce) joins the next step, as
with ``Tracer.step``. A microbatch is the number of backward passes already run in the step, so a
forward and the backward of its loss share one; a no-grad forward has none (-1): it has no backward
to pair with.
"""

from __future__ import annotations

from typing import Any

FORWARD = "forward-compute"
NO_GRAD_FORWARD = "no-grad-forward"
BACKWARD = "backward-compute"
OPTIMIZER = "optimizer"
DATA_WAIT = "data-wait"


class Phases:
    """The phase stack of one tracer (see the module docstring). Not thread-safe by itself: it is
    driven by the training thread and, on GPU, by autograd's device thread while the training
    thread is blocked in ``backward()``."""

    def __init__(self, tracer: Any) -> None:
        self.t = tracer
        self._stack: list[list[Any]] = []  # [op type, open segment context or None]
        self._codes: dict[str, int] = {}
        self.step = 0
        self.microbatch = 0
        self.started = False  # nothing before the first phase is recorded (set-up collectives)
        self._step_optimizer: int | None = None
        self._paused = 0
        self.on_open: Any = lambda: None
        self.on_start: Any = lambda: None
        self._mark: tuple | None = None  # where the open step's records start on the page
        self.backward_passes = 0  # every backward run, for what to say when no step ever ended

    # ------------------------------------------------------------------ segments
    def _code(self, name: str) -> int:
        code = self._codes.get(name)
        if code is None:
            code = self._codes[name] = self.t._code(name, "compute", self.t._main_stream)
        return code

    def _open(self, entry: list[Any]) -> None:
        t = self.t
        self.on_open()  # communication completed meanwhile joins this segment (it waited for it)
        mb = self.microbatch if entry[0] in (FORWARD, BACKWARD) else -1
        ctx = t._op_cls(t, self._code(entry[0]), mb, -1, None)
        ctx.__enter__()
        entry[1] = ctx

    @staticmethod
    def _close(entry: list[Any]) -> None:
        ctx, entry[1] = entry[1], None
        if ctx is not None:
            ctx.__exit__(None, None, None)

    def recording(self) -> bool:
        t = self.t
        return t._enabled and not t._skip and not t._closed

    # ------------------------------------------------------------------ phases
    def push(self, name: str) -> None:
        if not self.recording():
            return
        t = self.t
        if not t._in_step:
            if not self.started:  # collections during the set-up (imports, model building) are no step's
                t._gcq.clear()
                self.on_start()  # before the first step begins: what it costs is in no step
                self.started = True
            t._begin_step(self.step)
            self._mark = (t._page, t._first_op, t._n, t._na, len(t._bounds), len(t._side))
        if self._stack:
            self._close(self._stack[-1])
        entry = [name, None]
        self._stack.append(entry)
        if not self._paused:
            self._open(entry)

    def pop(self, name: str) -> None:
        """End the innermost phase ``name`` (and any phase left open above it)."""
        if not self._stack or not any(e[0] == name for e in self._stack):
            return
        while self._stack:
            entry = self._stack.pop()
            self._close(entry)
            if entry[0] == name:
                break
        if self._stack and not self._paused and self.recording():
            self._open(self._stack[-1])

    def drop_segment(self) -> Any:
        """Forget the open segment of the phase on top without recording it: its context (its start,
        op code, microbatch), or None when none is open. The caller records that time itself."""
        if not self._stack or self._stack[-1][1] is None:
            return None
        ctx, self._stack[-1][1] = self._stack[-1][1], None
        return ctx

    def pause(self) -> None:
        """A communication starts: the phase on top stops owning the time."""
        self._paused += 1
        if self._paused == 1 and self._stack:
            self._close(self._stack[-1])

    def resume(self) -> None:
        self._paused = max(0, self._paused - 1)
        if not self._paused and self._stack and self._stack[-1][1] is None and self.recording():
            self._open(self._stack[-1])

    def top(self) -> str | None:
        return self._stack[-1][0] if self._stack else None

    # ------------------------------------------------------------------ step boundaries
    def backward_done(self) -> None:
        self.microbatch += 1
        self.backward_passes += 1

    def optimizer_done(self, optimizer: Any, inner: frozenset[int] = frozenset()) -> bool:
        """The outermost ``optimizer.step()`` returned (``inner``: the ids of the optimizers that
        stepped inside it): True when that ends the step. A step optimizer given that is a wrapper's
        inner one ends the step with the wrapper's step, since the wrapper's work after it is the
        step's."""
        if self._step_optimizer is None:
            self._step_optimizer = id(optimizer)
        if id(optimizer) != self._step_optimizer and self._step_optimizer not in inner:
            return False
        self.end_step()
        return True

    def set_step_optimizer(self, optimizer: Any) -> None:
        self._step_optimizer = id(optimizer)

    def end_step(self) -> None:
        while self._stack:
            self._close(self._stack.pop())
        t = self.t
        if t._in_step:
            t._end_step()
            self.step += 1
        self.microbatch = 0

    def close(self) -> None:
        """Tracing stops. A step still open never reached its optimizer step (an evaluation after the
        last training step, a loop cut short): it is no training step, and a short last step would
        read as a fast one, so its records are taken back where they are all still on the page."""
        while self._stack:
            self._close(self._stack.pop())
        t = self.t
        mark = self._mark
        if self.step == 0 and self.backward_passes:
            # no step ever ended although training ran: said in the rank's state (``check_trace``)
            t._state.update(no_step_ended={"backward_passes": self.backward_passes})
        if not t._in_step or mark is None or t._cuda is not None:
            return
        page, first_op, n, na, nbounds, nside = mark
        if page is not t._page or first_op != t._first_op:  # part of the step has left with a page
            return
        t._n, t._na, t._room = n, na, 0
        del t._bounds[nbounds:], t._side[nside:]
        t._bstep = t._bounds[-1][1] if t._bounds else -1
        t._joins.clear()
        t._in_step = False
        t._gcq.clear()
