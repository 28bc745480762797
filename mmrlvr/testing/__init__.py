"""Test helpers that tests, benchmarks and demos share — not part of the training path.

- ``fake_run``: writes a synthetic run folder (images, boxes, rollouts, metrics) for the inspector's tests and
  ``benchmarks/inspector_scale.py``;
- ``judge_server``: a real local OpenAI-compatible HTTP server (scripted or tiny-model judges, fault injection:
  drips, huge bodies, echoes) for the rubric tests and the rubric authoring demo.

Nothing in ``mmrlvr`` outside this package imports it.
"""
