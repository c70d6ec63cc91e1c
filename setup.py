"""laggard's compiled parts: Tracer.op's fast path (src/laggard/tracer/_fastop.c) and the replay's
segment loop (src/laggard/engine/_replay.c).

Optional: where they cannot be built (no C compiler) the install goes on and the same paths run in
Python (slower, the same records and the same replayed times)."""

from setuptools import Extension, setup

_FLAGS = ["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers",
          "-Wno-cast-function-type"]

setup(ext_modules=[
    Extension("laggard.tracer._fastop", ["src/laggard/tracer/_fastop.c"], optional=True, extra_compile_args=_FLAGS),
    Extension("laggard.engine._replay", ["src/laggard/engine/_replay.c"], optional=True, extra_compile_args=_FLAGS),
])
