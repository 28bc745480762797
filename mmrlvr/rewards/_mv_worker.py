"""Entry point of the math-verify worker process (``python -m mmrlvr.rewards._mv_worker``).

Kept apart from ``mathverify`` so that running it does not re-execute a module the package already imported.
"""

from mmrlvr.rewards.mathverify import _serve

if __name__ == "__main__":
    _serve()
