"""Every input document of a run ends in exactly one place: a branch's final output, a removal
(stage, branch and reason), or a sink (lang_id's ``lang=other``: languages without a branch, kept
as data and counted). The last data step of a spec pipeline checks it from the stages'
metadata.json and the run's plan::

    input + Σ generated = Σ final outputs + Σ removed + Σ sinks

(``generated``: documents a stage adds, e.g. synthesize's rephrasings)

and, at every hand-over, that a stage read what the stage before it wrote (so a stage that
loses documents is named). A failing check fails the run. The result is written to
``<run>/conservation.json``; ``prepline pipeline run --local`` prints it. No kfp import here.
"""

from __future__ import annotations

import json

from prepline.errors import RunFailed
from prepline.pipelines.spec import SPLIT

RESULT_FILE = "conservation.json"


def _meta(path: str) -> dict | None:
    from prepline.data_access import open_location

    text = open_location(path).read_text("metadata.json")
    return json.loads(text) if text else None


def _where(e: dict) -> str:
    return e["stage"] + (f" ({e['branch']})" if e["branch"] else "")


def account(plan: dict, read_meta=_meta) -> dict:
    """The run's document accounting from the plan's stages' metadata.json (``read_meta(output)``)."""
    problems: list[str] = []
    removed: dict[str, dict[str, int]] = {}
    generated: dict[str, dict[str, int]] = {}
    entries = [e for e in plan["entries"] if e["runs"]]
    wrote: dict[str, int] = {}  # output path -> documents written there (split parts included)
    first_in = None
    for e in entries:
        m = read_meta(e["output"])
        if m is None or m.get("status") != "success":
            problems.append(f"{_where(e)}: no successful metadata.json in {e['output']}")
            continue
        t = m["totals"]
        failed = int(t.get("docs_in_failed_files", 0))
        if t.get("failed_files_docs_unknown"):
            problems.append(f"{_where(e)}: {t['failed_files_docs_unknown']} failed input file(s) whose documents are unknown")
        got = int(t["docs_in"]) + failed
        if first_in is None:
            first_in = got
        elif e["input"] in wrote and wrote[e["input"]] != got:
            problems.append(f"{_where(e)} read {got:,} documents where the stage before it wrote {wrote[e['input']]:,} "
                            f"({e['input']}): {wrote[e['input']] - got:,} lost")
        elif e["input"] not in wrote:
            problems.append(f"{_where(e)} read {e['input']}, which no stage of the run wrote")
        r = {k: int(v) for k, v in t["removed"].items() if v}
        if failed:
            r["failed_files"] = failed
        if r:
            removed[_where(e)] = r
        if t.get("generated"):
            generated[_where(e)] = {k: int(v) for k, v in t["generated"].items()}
        wrote[e["output"]] = int(t["docs_out"])
        for part, n in (t.get("parts") or {}).items():
            wrote[f"{e['output']}/{part}"] = int(n)
    finals = {b: wrote.get(p, 0) for b, p in plan.get("finals", {}).items()}
    if not plan.get("finals") and entries:
        last = entries[-1]["output"]
        finals = {"": wrote.get(last, 0)}
    sinks = _sinks(plan, entries, wrote)
    total_removed = sum(sum(r.values()) for r in removed.values())
    out_total = sum(finals.values())
    sink_total = sum(s["docs"] for s in sinks)
    gen_total = sum(sum(g.values()) for g in generated.values())
    holds = not problems and (first_in or 0) + gen_total == out_total + total_removed + sink_total
    if not problems and not holds:
        problems.append(f"input {first_in:,}" + (f" + generated {gen_total:,}" if gen_total else "")
                        + f" != outputs {out_total:,} + removed {total_removed:,} + kept aside {sink_total:,}")
    out = {"format": "prepline.conservation", "run": plan["run"], "input": first_in or 0, "outputs": finals,
           "outputs_total": out_total, "removed": removed, "removed_total": total_removed, "sinks": sinks,
           "sinks_total": sink_total, "holds": holds, "problems": problems}
    if generated:
        out.update(generated=generated, generated_total=gen_total)
    return out


def _sinks(plan: dict, entries: list[dict], wrote: dict) -> list[dict]:
    """Split parts no branch reads (lang=other when there is no other branch)."""
    split = [e for e in entries if e["stage"] == SPLIT and not e["branch"]]
    if not split or not plan.get("finals"):
        return []
    base = split[-1]["output"]
    read = {e["input"] for e in entries}
    return [{"stage": SPLIT, "part": p.rsplit("/", 1)[-1], "path": p, "docs": n}
            for p, n in sorted(wrote.items()) if p.startswith(base + "/lang=") and p not in read and n]


def check(plan: dict, result: dict | None = None, write: bool = True) -> dict:
    """Account for the run (unless ``result`` is that already) and write ``conservation.json``;
    raise RunFailed when documents are missing."""
    from prepline.data_access import open_location

    result = result or account(plan)
    if write:
        open_location(plan["run"]).write_bytes(RESULT_FILE, (json.dumps(result, indent=2) + "\n").encode("utf-8"))
    if not result["holds"]:
        raise RunFailed("documents are not all accounted for: " + "; ".join(result["problems"]),
                        f"see {plan['run']}/{RESULT_FILE} and the named stage's metadata.json")
    return result


def summary_lines(result: dict) -> list[str]:
    """The accounting in a few lines (the local run's summary, the KFP step's Markdown)."""
    sink = ", ".join(f"{s['part']} {s['docs']:,}" for s in result["sinks"])
    outs = ", ".join(f"{b or 'output'} {n:,}" for b, n in result["outputs"].items())
    gen = f" + {result['generated_total']:,} generated" if result.get("generated_total") else ""
    lines = [f"documents: {result['input']:,} in{gen} = {result['outputs_total']:,} out ({outs}) + {result['removed_total']:,} removed"
             + (f" + {result['sinks_total']:,} kept aside ({sink}: languages without a branch)" if result["sinks"] else "")
             + (" ✓" if result["holds"] else " ✗ DOES NOT HOLD")]
    lines += [f"  {p}" for p in result["problems"]]
    return lines
