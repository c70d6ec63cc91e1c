"""The one compiled part of laggard: Tracer.op's fast path (src/laggard/tracer/_fastop.c).

Optional: where it cannot be built (no C compiler) the install goes on and the tracer uses the
same path in Python (slower per op, the same records)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("laggard.tracer._fastop", ["src/laggard/tracer/_fastop.c"], optional=True,
                             extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                                 "-Wno-missing-field-initializers", "-Wno-cast-function-type"])])
