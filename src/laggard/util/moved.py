"""Modules that moved when the package was laid out by layer: importing an old path still works,
warns with ``DeprecationWarning`` naming the new one, and gives a module whose names are the new
module's. ``laggard/__init__`` installs the finder; the map is the one list of moves."""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import types
import warnings

# old module -> new module
MOVED: dict[str, str] = {
    "laggard.ops": "laggard.optable.ops",
    "laggard.io.template": "laggard.optable.template",
    "laggard.tracer.state": "laggard.optable.tracedir",
    "laggard.graph": "laggard.engine.graph",
    "laggard.gaps": "laggard.engine.gaps",
    "laggard.replay": "laggard.engine.replay",
    "laggard.replay_chain": "laggard.engine.replay_chain",
    "laggard.symmetry": "laggard.engine.symmetry",
    "laggard.spikes": "laggard.engine.spikes",
    "laggard.warmup": "laggard.engine.warmup",
    "laggard.arrivals": "laggard.engine.arrivals",
    "laggard.whatif_custom": "laggard.whatif.custom",
    "laggard.io.kineto_comm": "laggard.io.kineto.comm",
    "laggard.io.kineto_events": "laggard.io.kineto.events",
    "laggard.io.kineto_layout": "laggard.io.kineto.layout",
    "laggard.io.kineto_match": "laggard.io.kineto.match",
    "laggard.io.kineto_rank": "laggard.io.kineto.rank",
    "laggard.io.kineto_segments": "laggard.io.kineto.segments",
    "laggard.io.kineto_steps": "laggard.io.kineto.steps",
    "laggard.io.ndtimeline_clean": "laggard.io.ndtimeline.clean",
    "laggard.io.ndtimeline_meta": "laggard.io.ndtimeline.meta",
    "laggard.io.ndtimeline_template": "laggard.io.ndtimeline.template",
    "laggard.io.perfetto": "laggard.report.perfetto",
    "laggard.monitor.ingest": "laggard.wire.batch",
    "laggard.monitor.client": "laggard.wire.client",
    "laggard.synth": "laggard.groundtruth.synth",
    "laggard.inject": "laggard.groundtruth.inject",
    "laggard.evaluate": "laggard.groundtruth.evaluate",
    "laggard.evaluate_mixed": "laggard.groundtruth.evaluate_mixed",
    "laggard.dessim": "laggard.groundtruth.dessim",
    "laggard.dessim.causes": "laggard.groundtruth.dessim.causes",
    "laggard.dessim.engine": "laggard.groundtruth.dessim.engine",
    "laggard.dessim.export": "laggard.groundtruth.dessim.export",
    "laggard.dessim.schedule": "laggard.groundtruth.dessim.schedule",
    "laggard.dessim.truth": "laggard.groundtruth.dessim.truth",
    "laggard.dessim.cli": "laggard.cli.dessim",
    "laggard.tracer.demo": "laggard.demo.run",
    "laggard.tracer.launch": "laggard.demo.launch",
    "laggard.tracer.cli": "laggard.cli.demo",
    "laggard.cli_mitigate": "laggard.cli.mitigate",
    "laggard.hang.cli": "laggard.cli.hang",
    "laggard.fleet.cli": "laggard.cli.fleet",
    "laggard.simulate.cli": "laggard.cli.simulate",
    "laggard.collectives.cli": "laggard.cli.collectives",
    "laggard.monitor.cli": "laggard.cli.monitor",
}
# old packages: their old submodules are found through them
_PACKAGES = {"laggard.dessim"}

# The finder and loader follow the import protocol without subclassing ``importlib.abc``: importing
# that module loads ``importlib.resources`` and ``tempfile`` (~30 ms of every `laggard` start-up).


class _Loader:
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        warnings.warn(f"{module.__name__} moved to {self.new}; import it from there", DeprecationWarning, stacklevel=2)
        target = importlib.import_module(self.new)
        module.__doc__ = target.__doc__

        def __getattr__(name: str) -> object:
            return getattr(target, name)

        def __dir__() -> list[str]:
            return dir(target)

        module.__getattr__ = __getattr__  # type: ignore[method-assign]
        module.__dir__ = __dir__  # type: ignore[method-assign]


class MovedFinder:
    """Finds the old paths of moved modules (and only those)."""

    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Loader(new), is_package=fullname in _PACKAGES)


def install() -> None:
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())
