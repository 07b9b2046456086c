"""A pipeline run's folder as its stages wrote it, ``<work_root>/<run id>/`` (a local path or an
``s3://`` URI): each ``[lang=<code>/]<stage>/metadata.json``, the training metrics under
``fine_tune/``, and what a spec pipeline's steps wrote: the run's plan (``plan.json``, whose
stage order the rows follow) and its accounting of every document (``conservation.json``). Read
by the run report (:mod:`prepline.report`) and the command line's tables (:mod:`prepline.tables`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from prepline.data_access import Location, open_location

METADATA = "metadata.json"
TRAIN_DIR = "fine_tune"
PLAN = "plan.json"
CONSERVATION = "conservation.json"


@dataclass
class StageRun:
    """One stage's metadata.json in a run folder."""

    stage: str
    branch: str  # '' outside the per-language branches
    rel: str  # folder relative to the run folder, e.g. 'lang=en/filter'
    meta: dict

    @property
    def row(self) -> str:
        return f"{self.stage} ({self.branch})" if self.branch else self.stage


def as_location(run: str | Path | Location) -> Location:
    return run if isinstance(run, Location) else open_location(str(run))


def _json(loc: Location, rel: str) -> dict | None:
    try:
        d = json.loads(loc.read_text(rel) or "null")
    except ValueError:
        return None
    return d if isinstance(d, dict) else None


def stage_order(run: str | Path | Location) -> dict[str, int]:
    """The stages in the order of the run's plan (``plan.json``); empty without one."""
    plan = _json(as_location(run), PLAN) or {}
    names = [e.get("stage") for e in plan.get("entries") or [] if isinstance(e, dict)]
    return {s: i for i, s in enumerate(dict.fromkeys(n for n in names if n))}


def conservation(run: str | Path | Location) -> dict | None:
    """The run's accounting of every document (``conservation.json``), when a check_documents step wrote one."""
    return _json(as_location(run), CONSERVATION)


def stage_metadata(run: str | Path | Location) -> list[StageRun]:
    """Every stage of a run folder in pipeline order: the stages before the branches, then each
    branch's stages (branches by name); in the order of the run's plan, else by start time."""
    loc = as_location(run)
    order = stage_order(loc)
    found = []
    for f in loc.list_all():
        parts = f.rel.split("/")
        if parts[-1] != METADATA or len(parts) not in (2, 3) or any(p.startswith(("_", ".")) for p in parts):
            continue
        if len(parts) == 3 and not parts[0].startswith("lang="):
            continue
        text = loc.read_text(f.rel)
        try:
            meta = json.loads(text or "")
        except ValueError:
            continue
        if not isinstance(meta, dict) or "totals" not in meta:
            continue
        branch = parts[0].removeprefix("lang=") if len(parts) == 3 else ""
        found.append(StageRun(parts[-2], branch, "/".join(parts[:-1]), meta))
    return sorted(found, key=lambda s: (s.branch != "", s.branch, order.get(s.stage, len(order)), s.meta.get("started") or "", s.stage))


def training(run: str | Path | Location) -> tuple[dict | None, list[dict]]:
    """The fine-tune summary (metrics.json) and its steps (metrics.jsonl), when the run trained."""
    loc = as_location(run)
    summary = loc.read_text(f"{TRAIN_DIR}/metrics.json")
    steps_text = loc.read_text(f"{TRAIN_DIR}/metrics.jsonl") or ""
    steps = []
    for ln in steps_text.splitlines():
        try:
            rec = json.loads(ln)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("step"), int) and isinstance(rec.get("loss"), (int, float)):
            steps.append(rec)
    return (json.loads(summary) if summary else None), steps
