"""How an op becomes a record of the Tracer's current page: the general write path (any step,
communication fields, joins, full pages), ops deferred between steps, the communication fields
(group code, per-group sequence), op type codes, and CUDA ops resolved at step boundaries. A mixin
of ``laggard.tracer.Tracer``; the inlined common case is ``Tracer.op`` (and ``_fastop``)."""

from __future__ import annotations

import struct

from laggard.errors import LaggardError
from laggard.tracer._contexts import _OpCtx
from laggard.tracer._page import AUX_BYTES, RECORD_BYTES, Side

KIND_NAMES = ("compute", "collective", "p2p_send", "p2p_recv", "other")
MAX_PENDING_OPS = 4096  # ops recorded between steps, attached to the next step
# an aux tuple (size_bytes, seq, group, peer, side) carries its Side object (or -1) until the record
# is written, where it becomes an index into that page's side list: the page may be handed off between
# the op's start and its record (a full page, nested ops, CUDA ops resolved steps later)


class RecordMixin:
    def _rec(self, code: int, mb: int, start: int, dur: int, ntok: int, aux: tuple | None) -> None:
        """Record an op of the current step (between steps: keep it for the next step)."""
        if not self._in_step:
            self._defer((code, mb, start, dur, ntok, aux))
            return
        self._write(self._step, code, mb, start, dur, ntok, aux)

    def _write(self, step: int, code: int, mb: int, start: int, dur: int, ntok: int, aux: tuple | None) -> int:
        """The general path: any step, communication fields, joins, full pages. Returns the local op id."""
        if self._joins and self._in_step and step == self._step:
            aux = self._join(aux)
        i = self._n
        if i >= self._cap and (i := self._rotate()) < 0:
            self.num_ops_dropped += 1
            return -1
        if step != self._bstep:
            self._bounds.append((i, step))
            self._bstep = step
        a = -1
        try:
            if aux is not None:
                if isinstance(aux[4], Side):  # into the side list of the page the record goes to (now)
                    aux = (*aux[:4], self._add_side(aux[4]))
                a = self._na
                self._auxpack(self._amv, a * AUX_BYTES, *aux)
                self._na = a + 1
            self._pack(self._mv, i * RECORD_BYTES, start, dur, ntok, code, mb, a)
        except struct.error:
            raise LaggardError(f"Tracer: microbatch, num_tokens, size_bytes and peer must be integers, got "
                               f"{mb!r}, {ntok!r}, {aux[0] if aux else None!r}, {aux[3] if aux else None!r}") from None
        self._n = i + 1
        if self._in_step and step != self._step:  # back to the current step for the rows that follow
            self._bounds.append((i + 1, self._step))
            self._bstep = self._step
        self._room = self._cap if self._in_step and not self._joins and self._bstep == self._step else 0
        return self._first_op + i

    def _write_in(self, step: int | None, args: tuple) -> int:
        """Record ``args`` (as for _rec) with the step it belongs to: now, or deferred to the next step."""
        if step is None:
            self._defer(args)
            return -1
        return self._write(step, *args)

    def _defer(self, args: tuple) -> None:
        if len(self._pending) < MAX_PENDING_OPS:
            self._pending.append(args)
        else:
            self.num_ops_outside_steps_dropped += 1

    def _cpu_aux(self) -> tuple | None:
        """On GPU, CPU-timed ops (GC, data waits) sit beside the GPU stream, with no dependencies."""
        if self._cuda is None:
            return None
        return (-1, -1, -1, -1, Side(replace_chain=True, deps=[]))

    def _comm_aux(self, label: str, peer: int, size_bytes: int | None) -> tuple:
        gcode = self._group_code.get(label)
        if gcode is None:
            gcode = self._group_code[label] = len(self._groups)
            self._groups.append(label)
        seq = self._seqs.get(gcode, 0)
        self._seqs[gcode] = seq + 1
        self._ncalls[gcode] = self._ncalls.get(gcode, 0) + 1
        return (-1 if size_bytes is None else int(size_bytes), seq, gcode, peer, -1)

    def _comm_ctx(self, name: str, kind: str, label: str, peer: int, size_bytes: int | None,
                  microbatch: int) -> _OpCtx:
        code = self._code(name, kind, self._main_stream)
        cls = self._op_cls
        return cls(self, code, microbatch, -1, self._comm_aux(label, peer, size_bytes))

    def _resolve_cuda(self) -> None:
        assert self._cuda is not None
        for step, args in self._cuda.completed():  # dated from their step's anchor (tracer/cuda.py)
            self._write_in(step, args)

    def _code(self, name: str, kind: str, stream: str) -> int:
        key = (name, kind, stream)
        c = self._optype_code.get(key)
        if c is None:
            if kind not in KIND_NAMES:
                raise LaggardError(f"Tracer: kind must be one of {', '.join(KIND_NAMES)}, not {kind!r}")
            c = self._optype_code[key] = len(self._optypes)
            self._optypes.append(key)
        return c
