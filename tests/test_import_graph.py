"""The package's imports point down the data path: no circles (tools/import_cycles.py's rule, as a test).

A package ``__init__`` is a module of its own; ``from pkg.a import b`` is an edge to ``pkg.a.b`` when that is a
module, else to ``pkg.a``; imports at any depth of a file count (also those inside functions).
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "mmrlvr"


def _graph() -> dict[str, set[str]]:
    mods: dict[str, Path] = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, p in mods.items():
        pkg = m if p.name == "__init__.py" else m.rpartition(".")[0]
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mod = node.module or ""
                if node.level:
                    up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    mod = ".".join(up + ([mod] if mod else []))
                targets = [f"{mod}.{a.name}" for a in node.names] + [mod]
            else:
                continue
            for t in targets:
                r = resolve(t)
                if r and r != m:
                    edges[m].add(r)
                    break
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_cycle_finder_finds_a_planted_circle():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(edges) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles_in_mmrlvr():
    assert _cycles(_graph()) == []


def test_trainer_names_no_method():
    """The trainer orchestrates; losses, schemes and rewards are chosen by the stages (issue 18)."""
    from mmrlvr.algos import ADVANTAGES, POLICY_LOSSES
    from mmrlvr.credit import CREDIT_SCHEMES
    from mmrlvr.rewards import REWARDS

    text = (PKG / "train" / "trainer.py").read_text()
    assert len(text.splitlines()) <= 250
    import re

    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text)) | set(re.findall(r"['\"]([^'\"]+)['\"]", text))
    names = {n for reg in (ADVANTAGES, POLICY_LOSSES, CREDIT_SCHEMES, REWARDS) for n in reg.names()} - {"none"}
    assert not (words & names), f"trainer.py names {sorted(words & names)}"
