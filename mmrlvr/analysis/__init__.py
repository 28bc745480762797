"""``mmrlvr analyze``: what RL did to a model, read from a run's checkpoints and rollouts (docs/analysis.md).

Each analysis is a Python function over a run folder and a sub-command of ``mmrlvr analyze``; each writes
``RUN_DIR/analysis/<name>/`` (``results.json``, ``results.md``, PNG plots) through ``mmrlvr.analysis.report``.
Checkpoints are read with the loader ``eval`` and ``export`` use (``mmrlvr.analysis.checkpoints``): full weights,
LoRA adapters merged into their base (ΔW = B·A·scale per layer), and sharded runs.
"""
