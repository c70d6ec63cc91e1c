"""The Tracer's pages as they fill and go: a full page handed to the background writer, a free one
taken from the preallocated pool (the training thread never allocates one), the counts written to the
rank's state. A mixin of ``laggard.tracer.Tracer``; its fields are set up by ``_init_pages``."""

from __future__ import annotations

import queue
import threading

import numpy as np

from laggard.tracer._page import AUX_DTYPE, AUX_PACK, PACK, RECORD_DTYPE, FullPage, Side


class PagingMixin:
    def _init_pages(self, page_ops: int, num_pages: int) -> None:
        # pages: preallocated, recycled by the writer; the training thread never allocates one
        self._free: queue.SimpleQueue[tuple[np.ndarray, np.ndarray]] = queue.SimpleQueue()
        for _ in range(num_pages):
            self._free.put((np.zeros(page_ops, dtype=RECORD_DTYPE), np.zeros(page_ops, dtype=AUX_DTYPE)))
        self._page: np.ndarray | None = None
        self._aux: np.ndarray | None = None
        self._mv = memoryview(b"")
        self._amv = memoryview(b"")
        self._cap = 0
        self._n = 0
        self._na = 0
        self._room = 0  # rows the inlined path may fill: the page's capacity while in a step with no
        # pending joins and the page on the current step, else 0 (everything goes through _write)
        self._bounds: list[tuple[int, int]] = []
        self._bstep = -1
        self._first_op = 0
        self._side: list[Side] = []
        self._pack = PACK.pack_into
        self._auxpack = AUX_PACK.pack_into
        self._next_page()
        self._optypes: list[tuple[str, str, str]] = []
        self._optype_code: dict[tuple[str, str, str], int] = {}
        self._compute_code: dict[str, int] = {}
        self._groups: list[str] = []
        self._group_code: dict[str, int] = {}
        self._pg_labels: dict[int, str] = {}

    def _add_side(self, s: Side) -> int:
        self._side.append(s)
        return len(self._side) - 1

    def _page_free(self, bufs: tuple[np.ndarray, np.ndarray] | None) -> None:
        if bufs is not None:
            self._free.put(bufs)

    def _take(self, sync: threading.Event | None = None) -> FullPage | None:
        n = self._n
        if self._page is None or (n == 0 and sync is None):
            return None
        assert self._aux is not None
        page = FullPage(records=self._page[:n], aux=self._aux[: self._na], steps=self._bounds,
                        first_op=self._first_op, side=self._side, optypes=list(self._optypes),
                        groups=list(self._groups), buffer=(self._page, self._aux), sync=sync)
        self.num_ops_recorded += n
        self._first_op += n
        self._page = self._aux = None
        self._mv = self._amv = memoryview(b"")
        self._side = []
        self._bounds = []
        self._bstep = -1
        self._cap = self._n = self._na = 0
        self._room = 0
        return page

    def _hand_off(self) -> None:
        page = self._take()
        self._last_flush_ns = self._clock()
        self._update_counts()
        if self._writer.failed is not None:
            self._enabled = self._plain = False  # the writer warned once; stop recording for nothing
        if page is not None:
            self._writer.submit(page)
        self._next_page()

    def _next_page(self) -> bool:
        try:
            recs, aux = self._free.get_nowait()
        except queue.Empty:
            return False
        self._page, self._aux = recs, aux
        self._mv = memoryview(recs).cast("B")
        self._amv = memoryview(aux).cast("B")
        self._cap = len(recs)
        self._n = self._na = 0
        self._bounds = [(0, self._step if self._in_step else -1)]
        self._bstep = self._bounds[0][1]
        self._room = self._cap if self._in_step and not self._joins else 0
        return True

    def _rotate(self) -> int:
        """The page is full (or there is none): hand it off and continue on a free one; -1 to drop."""
        if not self._enabled:
            return -1
        if self._page is not None:
            self._hand_off()
        elif not self._next_page():
            return -1
        return 0 if self._page is not None else -1

    def _update_counts(self) -> None:
        self._state.update(num_ops_recorded=self.num_ops_recorded, num_ops_dropped=self.num_ops_dropped,
                           num_ops_outside_steps_dropped=self.num_ops_outside_steps_dropped)
        if self._cuda is not None:
            self._state.update(self._cuda.stats())
