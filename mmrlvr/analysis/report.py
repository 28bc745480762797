"""Where an analysis writes: ``RUN_DIR/analysis/<name>/`` with ``results.json`` (the numbers), ``results.md`` (a
table a person reads) and PNG plots, each written atomically (a crash never leaves half a file)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from mmrlvr.store.atomic import atomic_path, atomic_write_json, atomic_write_text


def analysis_dir(run_dir: str | Path, name: str) -> Path:
    out = Path(run_dir) / "analysis" / name
    out.mkdir(parents=True, exist_ok=True)
    return out


def markdown_table(header: list[str], rows: list[list[Any]], digits: int = 4) -> str:
    """A Markdown table; floats to ``digits`` significant digits."""
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.{digits}g}"
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def write_report(run_dir: str | Path, name: str, numbers: dict[str, Any], markdown: str,
                 plots: dict[str, Callable[[], Any]] | None = None) -> Path:
    """Write one analysis's outputs; ``plots`` maps a PNG file name to a function returning a matplotlib figure
    (drawn headless, closed after saving)."""
    out = analysis_dir(run_dir, name)
    atomic_write_json(out / "results.json", json.loads(json.dumps(numbers, default=float)))
    atomic_write_text(out / "results.md", markdown.rstrip() + "\n")
    if plots:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        for file, draw in plots.items():
            fig = draw()
            with atomic_path(out / file) as tmp:
                fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
            plt.close(fig)
    return out
