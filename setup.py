"""laggard's compiled parts: Tracer.op's fast path (src/laggard/tracer/_fastop.c) and the engine's
kernels, the replay's segment loop and the graph's levels (src/laggard/engine/_replay.c).

Optional: where they cannot be built (no C compiler) the install goes on and the same paths run in
Python (slower, the same records and the same replayed times)."""

from setuptools import Extension, setup

_FLAGS = ["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers",
          "-Wno-cast-function-type"]
# -O3 for the replay: its max over a row of scenario columns is vectorized there (a 2-D replay of
# trace-AR's 23 columns 4.8 ms against 9 at -O2); no -ffast-math, so every sum and max is IEEE's
_REPLAY_FLAGS = ["-O3", *_FLAGS[1:]]

setup(ext_modules=[
    Extension("laggard.tracer._fastop", ["src/laggard/tracer/_fastop.c"], optional=True, extra_compile_args=_FLAGS),
    Extension("laggard.engine._replay", ["src/laggard/engine/_replay.c"], optional=True,
              extra_compile_args=_REPLAY_FLAGS),
])
