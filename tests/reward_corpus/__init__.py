"""The reward corpus: hand-written (gold, response, expected) cases with a reason each (see corpus.py)."""
