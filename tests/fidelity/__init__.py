"""Fidelity tests (issue 14): each loss, advantage, credit scheme and the consistency split against a small
example whose expected numbers are computed here from the paper's formula, plus the property tests that
catch the defects the line-by-line review found."""
