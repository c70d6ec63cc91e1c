# The compiled fast path of Tracer.op (_fastop.c); laggard.tracer.core uses it where it was built.
from collections.abc import Callable
from typing import Any

class OpMethod:
    __wrapped__: Callable[..., Any]
    def __init__(self, tracer: Any, slow: Callable[..., Any], /) -> None: ...
    def __call__(self, name: str, microbatch: int = -1, kind: str = "compute", num_tokens: int | None = None,
                 seq_lens: list[int] | None = None, stream: str | None = None) -> Any: ...

def setup(error: type[Exception], perf_counter_ns: Callable[[], int], record_bytes: int, /) -> None: ...
