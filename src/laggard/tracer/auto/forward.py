"""The forward phases of a zero-code session, from module forward hooks.

An outermost module call is a ``forward-compute`` phase, or a ``no-grad-forward`` where grad is
disabled outside a backward (``laggard.tracer.auto.phases``); calls inside it are its own. Given a
model, only its calls are hooked. Without one every module's forward is hooked for the first
``ROOT_STEPS`` steps, since which module a training step starts from is not known beforehand; then
only the modules a forward may start from (``forward_roots``), since a hook on every module costs
1-5 us a call.
"""

from __future__ import annotations

import weakref
from typing import Any

from laggard.tracer.auto import phases as ph

# steps with every module hooked before only the outermost ones are: a training step calls each of
# its outermost modules in its first steps (the first may differ: DDP's first iteration, warm-up)
ROOT_STEPS = 3


class ForwardHooks:
    """The forward hooks of one session (see the module docstring); ``session`` is the ``AutoTrace``
    they record for (its phases, its thread, whether it is in a backward, its communication capture)."""

    def __init__(self, session: Any) -> None:
        self.s = session
        self.depth = 0  # module calls open now: the outermost one is the phase
        self._phase = ph.FORWARD  # the phase the outermost forward open now pushed
        self._grad_enabled: Any = None  # torch.is_grad_enabled, bound once: the hook runs per call
        self._handles: list[Any] = []
        self._global: list[Any] = []  # the hooks on every module, until narrowed
        self._roots: dict[int, Any] = {}  # the modules called outermost while every module is hooked
        # weak references to the modules nothing holds, taken before the first step starts (so the
        # search is in no step's time): a forward may start from one after the first steps
        self._free: list[Any] = []

    def install(self, model: Any) -> None:
        import torch

        self._grad_enabled = torch.is_grad_enabled
        if model is not None:
            self._hook(model)
            return
        from torch.nn.modules import module as tmod

        self._global = [tmod.register_module_forward_pre_hook(self._pre),
                        tmod.register_module_forward_hook(self._post, always_call=True)]
        self._handles += self._global

    def uninstall(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._global = []

    def _hook(self, module: Any) -> None:
        self._handles += [module.register_forward_pre_hook(self._pre),
                          module.register_forward_hook(self._post, always_call=True)]

    def _pre(self, module: Any, args: Any) -> None:
        s = self.s
        if self.depth == 0 and self._global and s.owns_thread():
            self._roots.setdefault(id(module), module)
        if self.depth == 0 and s._active_tracer() is not None:
            s.capture.flush()
            # inside a backward a forward is checkpoint's recompute of a training forward, whatever
            # the grad mode autograd runs it under
            training = s.in_backward or self._grad_enabled()
            self._phase = ph.FORWARD if training else ph.NO_GRAD_FORWARD
            s.phases.push(self._phase)
        self.depth += 1

    def _post(self, module: Any, args: Any, output: Any) -> None:
        self.depth = max(0, self.depth - 1)
        if self.depth == 0 and self.s.phases is not None and self.s.owns_thread():
            self.s.phases.pop(self._phase)

    def find_free(self) -> None:
        """Before the first step begins (``Phases.on_start``): the modules nothing holds, while every
        module is hooked."""
        if self._global:
            self._free = [weakref.ref(m) for m in free_modules()]

    def step_ended(self, step: int) -> None:
        """After step ``step`` ended: past the first steps, and outside any forward, hook only the
        modules a forward may start from."""
        if step != ROOT_STEPS or not self._global or self.depth:
            return
        for h in self._global:
            h.remove()
            self._handles.remove(h)
        self._global = []
        free = [m for m in (r() for r in self._free) if m is not None]
        for module in forward_roots(self._roots.values(), free):
            self._hook(module)
        self._roots.clear()


def free_modules() -> list[Any]:
    """Every module no other module holds (a model, an EMA copy, a teacher, a loss), found among the
    objects the garbage collector tracks (~0.1 s in a process with transformers imported)."""
    import gc

    from torch.nn import Module

    mods = [o for o in gc.get_objects() if issubclass(type(o), Module)]  # type(): a proxy's __class__ warns
    held = {id(c) for m in mods for c in m.children()}
    return [m for m in mods if id(m) not in held]


def forward_roots(called: Any, free: Any) -> list[Any]:
    """The modules a forward may start from once only some are hooked: those ``called`` outermost in
    the first steps; the ``free`` ones (``free_modules``: an EMA copy or an evaluation-only model first
    run after those steps); and below each of these the modules a wrapper holds alone (DDP's
    ``module``, Lightning's wrapped LightningModule, torch.compile's original), which an evaluation
    calls directly to skip the wrapper's gradient sync."""
    out: dict[int, Any] = {id(m): m for m in called}
    out.update((id(m), m) for m in free)
    for m in list(out.values()):
        kids = list(m.children())
        while len(kids) == 1:  # a wrapper: the one module it holds is what it runs
            out.setdefault(id(kids[0]), kids[0])
            kids = list(kids[0].children())
    return list(out.values())


__all__ = ["ROOT_STEPS", "ForwardHooks", "forward_roots", "free_modules"]
