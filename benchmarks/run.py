"""`make bench`: run every benchmarks/bench_*.py, print each figure beside its baseline, write results.json.

Each bench module defines ``run() -> list[dict]``; a figure is a dict with keys
``name`` (str), ``value`` (float), ``unit`` (str), and optionally ``baseline`` (what it is compared
with, measured in the same run), ``baseline_value``, ``target`` (str, e.g. "< 1.0 s"), ``ok`` (bool)
and ``detail`` (any JSON).  A module may take a while; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def _compile_package() -> None:
    """Byte-compile laggard's sources, as a regular (non-editable) install does: the benchmarks
    time commands as users run them, not Python compiling laggard's modules on every start
    (which an editable install under PYTHONDONTWRITEBYTECODE=1 would do, ~0.1 CPU-s)."""
    import compileall

    import laggard

    compileall.compile_dir(Path(laggard.__file__).parent, quiet=1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("only", nargs="*", help="run only bench modules whose name contains one of these")
    ap.add_argument("--out", default=str(HERE / "results.json"))
    args = ap.parse_args()
    results: dict[str, object] = {
        "machine": {"python": platform.python_version(), "cpu_count": __import__("os").cpu_count()},
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "benchmarks": {},
    }
    out = Path(args.out)
    if out.exists() and args.only:
        try:
            results["benchmarks"] = json.loads(out.read_text()).get("benchmarks", {})
        except (OSError, ValueError):
            pass
    _compile_package()
    failed = 0
    for path in sorted(HERE.glob("bench_*.py")):
        if args.only and not any(o in path.stem for o in args.only):
            continue
        print(f"== {path.stem}", flush=True)
        t0 = time.perf_counter()
        try:
            figures = _load(path).run()
        except Exception:  # a broken benchmark is reported, the others still run
            traceback.print_exc()
            failed += 1
            results["benchmarks"][path.stem] = {"error": traceback.format_exc(limit=3)}
            continue
        for f in figures:
            line = f"  {f['name']}: {f['value']:.4g} {f.get('unit', '')}"
            if f.get("baseline") is not None:
                bv = f.get("baseline_value")
                line += f"   | baseline {f['baseline']}" + (f": {bv:.4g} {f.get('unit', '')}" if bv is not None else "")
            if f.get("target"):
                line += f"   | target {f['target']}: {'OK' if f.get('ok') else 'MISSED'}"
            print(line, flush=True)
        results["benchmarks"][path.stem] = {"seconds": round(time.perf_counter() - t0, 2), "figures": figures}
    out.write_text(json.dumps(results, indent=2, default=float) + "\n")
    print(f"wrote {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
