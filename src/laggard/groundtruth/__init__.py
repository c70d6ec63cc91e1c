"""Ground truth for the analysis, from outside it: injected causes (``inject``), the synthetic job
generator (``synth``), the independent discrete-event simulator (``dessim``, SimPy) and the
sweeps that score the diagnosis against them (``evaluate``, ``evaluate_mixed``)."""
