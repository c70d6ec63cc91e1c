"""Small helpers every layer may use: no numpy, no pyarrow, nothing of laggard above ``errors``.

- ``lazy``: the public names of a package, imported from their modules on first use;
- ``moved``: import paths of modules that moved in the layered layout, kept working with a warning;
- ``ranges``: the ``A-B,C`` range syntax of ``--steps`` and ``--ranks``.
"""
