"""The ``prepline`` command line."""

from __future__ import annotations

import argparse
import html
import json
import os
import sys
import time
from typing import Any, NoReturn

from prepline import __version__, logs
from prepline.config import ParamInfo
from prepline.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_TERMINATED, EXIT_USAGE, ConfigError, PreplineError, RunFailed, Terminated, exit_code, user_message


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


# ----------------------------------------------------------------------------------------------
# run


def _add_param_options(parser: argparse.ArgumentParser, params: list[ParamInfo]) -> None:
    """One option per parameter: a boolean takes the bare flag (``--split``) or a value
    (``--split false``); a list repeats the option; the help names the allowed choices."""
    group = parser.add_argument_group("transform parameters")
    for p in params:
        flag = "--" + p.name.replace("_", "-")
        default = list(p.default) if p.type is list else p.default
        choices = f"; one of: {', '.join(map(str, p.choices))}" if p.choices else ""
        helptext = f"{p.help} (default: {json.dumps(default)}{choices})".replace("%", "%%")  # argparse formats help with %
        if p.type is list:
            group.add_argument(flag, dest=p.name, action="append", metavar="VALUE",
                               help=helptext + f"; repeat for several: {flag} a {flag} b, or one JSON list: {flag} '[\"a\", \"b\"]'")
        elif p.type is bool:
            group.add_argument(flag, dest=p.name, nargs="?", const="true", metavar="true|false",
                               help=helptext + f"; {flag} alone means true")
        else:
            group.add_argument(flag, dest=p.name, metavar=p.type_name.upper(), choices=p.choices, help=helptext)


def _run_parser(transform: str | None) -> argparse.ArgumentParser:
    from prepline import registry

    p = argparse.ArgumentParser(
        prog=f"prepline run {transform or '<transform>'}",
        description="Run one transform over a folder of Parquet files (local path or s3:// URI).",
    )
    p.add_argument("--input", required=True, help="input folder or s3://bucket/prefix")
    p.add_argument("--output", required=True, help="output folder (mirrors the input tree) + metadata.json")
    p.add_argument("--runtime", choices=("local", "ray"), default="local", help="local processes or a Ray cluster (default: local)")
    p.add_argument("--workers", type=int, default=0,
                   help="parallel workers (default 0: one per CPU); a local run takes at most one per usable CPU")
    p.add_argument("--workers-over-cpus", action="store_true",
                   help="allow a local run more workers than CPUs, up to 8 per CPU (also PREPLINE_WORKERS_OVER_CPUS=1)")
    p.add_argument("--cpus-per-worker", type=float, default=1.0, help="CPUs each Ray worker reserves (default 1)")
    p.add_argument("--gpus-per-worker", type=float, default=0.0,
                   help="GPUs each Ray worker reserves (default 0); Ray places workers on nodes that have them (synthesize with vLLM)")
    p.add_argument("--ray-address", default=None, help="join this Ray cluster (default: start a local one)")
    p.add_argument("--max-failed-files", type=int, default=0,
                   help="bad input files allowed to fail; they are listed (with their documents) in metadata.json (default 0)")
    p.add_argument("--task-retries", type=int, default=2,
                   help="times a task runs again when its worker process or Ray actor dies (default 2)")
    p.add_argument("--task-timeout", type=float, default=None, metavar="SECONDS",
                   help="a task that makes no progress (reads nothing, uses no CPU) this long has its worker stopped and runs "
                        "again elsewhere, or fails the run naming it (default: PREPLINE_TASK_TIMEOUT or 300; 0: never)")
    p.add_argument("--overwrite", action="store_true", help="delete what is in --output first (default: resume or refuse)")
    p.add_argument("--allow-empty-output", action="store_true",
                   help="succeed even when every document of a non-empty input is removed (default: that run fails, naming the reasons)")
    p.add_argument("--params", default=None, help="transform parameters as a JSON object (flags win)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar or lines")
    p.add_argument("--progress-interval", type=float, default=None, metavar="SECONDS",
                   help="seconds between progress lines when stderr is not a terminal (default: PREPLINE_PROGRESS_INTERVAL or 10)")
    if transform:
        _add_param_options(p, registry.get(transform).Config.params())
    return p


def parse_json(name: str, text: str, like: Any, example: str = '{"num_shards": 8}') -> Any:
    """A JSON option of the type of ``like``, or a ConfigError saying where the JSON breaks.
    NaN and Infinity are not JSON (Python's parser takes them): refused."""
    def no_constant(c: str):
        raise ValueError(f"{c} is not a JSON number")

    fix = f"pass {name} as a JSON {type(like).__name__}, e.g. {example}"
    try:
        v = json.loads(text, parse_constant=no_constant)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{name} is not valid JSON ({e.msg} at char {e.pos}): {text[:200]!r}", fix) from None
    except ValueError as e:
        raise ConfigError(f"{name}: {e}", "pass finite numbers") from None
    if not isinstance(v, type(like)):
        raise ConfigError(f"{name} must be a JSON {type(like).__name__}, got {type(v).__name__}", fix)
    return v


def params_from_args(args: argparse.Namespace, config: type) -> dict[str, Any]:
    """The parameters of ``config`` from ``--params`` JSON and the per-parameter flags (flags win)."""
    params: dict[str, Any] = parse_json("--params", args.params, {}) if args.params else {}
    for p in config.params():
        v = getattr(args, p.name, None)
        if p.type is list and isinstance(v, list) and len(v) == 1 and v[0].strip().startswith("["):
            v = v[0]  # one JSON list: parsed by the config
        if v is not None:
            params[p.name] = v
    return params


def _prestart_pool(name: str, argv: list[str]) -> None:
    """A local run on several workers: start the pool's processes before the driver imports pyarrow
    and the transform, so their start-up overlaps it (prepline.runtime.procs). Only for a command
    that will run: a valid --workers within the CPU bound, a local input that exists, an --output
    given; anything else starts no process here (the run's own checks then report it, and a run
    that gets that far starts its pool after them)."""
    import os

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--runtime", default="local")
    pre.add_argument("--workers", default="0")
    pre.add_argument("--workers-over-cpus", action="store_true")
    pre.add_argument("--input", default=None)
    pre.add_argument("--output", default=None)
    pre.add_argument("-h", "--help", action="store_true")
    try:
        known, _ = pre.parse_known_args(argv)
    except SystemExit:  # a malformed command: the real parser says what is wrong
        return
    if known.help or known.runtime != "local" or not known.workers.isdigit() or not known.input or not (known.output or "").strip():
        return
    from prepline.data_access import scheme_of
    from prepline.runtime.options import check_workers

    try:
        check_workers(int(known.workers), "local", known.workers_over_cpus)
    except ConfigError:
        return
    import importlib.util

    if not name.isidentifier() or name.startswith("_") or importlib.util.find_spec(f"prepline.transforms.{name}") is None:
        return  # not a built-in transform (a plug-in, or a typo the run reports): its pool starts after the checks
    inp = known.input
    if scheme_of(inp) is not None:
        return  # a remote input is checked by the run (a request, with its credentials), before its pool starts
    if inp.lower().startswith("file://"):
        inp = inp[len("file://"):]
    if not os.path.exists(os.path.expanduser(inp)):
        return
    from prepline.runtime.procs import prestart

    prestart(int(known.workers), name)


def cmd_run(argv: list[str]) -> int:
    from prepline.runtime.procs import drop_prestarted

    if argv and not argv[0].startswith("-"):
        _prestart_pool(argv[0], argv[1:])
    try:
        return _cmd_run(argv)
    finally:
        drop_prestarted()  # the run never needed them (resumed, or it failed before its first phase)


def _cmd_run(argv: list[str]) -> int:
    from prepline import registry

    if not argv or argv[0].startswith("-"):
        if argv and argv[0] in ("-h", "--help"):
            _run_parser(None).print_help()
            print("\ntransforms: " + ", ".join(registry.names()) + "  (prepline run <transform> --help for its parameters)")
            return 0
        raise ConfigError("prepline run needs a transform name", f"prepline run <transform> ...; transforms: {', '.join(registry.names())}")
    name, rest = argv[0], argv[1:]
    cls = registry.get(name)
    args = _run_parser(name).parse_args(rest)
    params = params_from_args(args, cls.Config)
    from prepline.engine import RunOptions, run_transform

    opts = RunOptions(
        input=args.input,
        output=args.output,
        runtime=args.runtime,
        workers=args.workers,
        cpus_per_worker=args.cpus_per_worker,
        gpus_per_worker=args.gpus_per_worker,
        ray_address=args.ray_address,
        max_failed_files=args.max_failed_files,
        task_retries=args.task_retries,
        **({"task_timeout": args.task_timeout} if args.task_timeout is not None else {}),
        overwrite=args.overwrite,
        progress=not args.no_progress,
        workers_over_cpus=args.workers_over_cpus,
        allow_empty_output=args.allow_empty_output,
    )
    from prepline.progress import Progress
    from prepline.tables import print_summary

    with Progress(args.progress_interval) as prog:
        result = run_transform(name, params, opts, progress=prog if opts.progress else None)
    if result.resumed:
        _console().print(f"[bold]{name}[/]: {result.output} is already complete for this input and these parameters; nothing ran")
    print_summary(result.metadata)
    return 0


# ----------------------------------------------------------------------------------------------
# list / describe / sample


def cmd_list(argv: list[str]) -> int:
    from prepline import registry

    from rich.table import Table

    argparse.ArgumentParser(prog="prepline list", description="List the transforms.").parse_args(argv)
    table = Table(header_style="bold")
    table.add_column("transform", no_wrap=True)  # a name is what users copy: never broken over lines
    table.add_column("what it does")
    table.add_column("extra", no_wrap=True)
    for n in registry.names():
        cls = registry.get(n)
        table.add_row(n, cls.summary, cls.extra or "")
    _console().print(table)
    return 0


def describe_markdown(name: str) -> str:
    """The parameter table of a transform, generated from its config (used by the docs too)."""
    from prepline import registry

    cls = registry.get(name)
    lines = [f"### {name}", "", cls.summary, "", "| parameter | type | default | description |", "|---|---|---|---|"]
    for p in cls.Config.params():
        d = list(p.default) if p.type is list else p.default
        choices = f" One of: {', '.join(map(str, p.choices))}." if p.choices else ""
        text = html.escape(p.help, quote=False)  # `<code>` is text, not an HTML tag, in Markdown
        lines.append(f"| `{p.name}` | {p.type_name} | `{json.dumps(d, ensure_ascii=False)}` | {text}.{choices} |")
    return "\n".join(lines) + "\n"


def cmd_describe(argv: list[str]) -> int:
    from prepline import registry

    ap = argparse.ArgumentParser(prog="prepline describe", description="Show a transform's parameters.")
    ap.add_argument("transform")
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    a = ap.parse_args(argv)
    cls = registry.get(a.transform)
    if a.json:
        out = {
            "name": cls.name,
            "summary": cls.summary,
            "parameters": [
                {"name": p.name, "type": p.type_name, "default": list(p.default) if p.type is list else p.default, "help": p.help, "choices": p.choices}
                for p in cls.Config.params()
            ],
        }
        print(json.dumps(out, indent=2))
    else:
        from rich.markdown import Markdown

        _console().print(Markdown(describe_markdown(a.transform)))
    return 0


def _sample_progress(total: int):
    """A bar on a terminal (stderr), else nothing: ``step(done, total)`` moves it."""
    import contextlib

    if not sys.stderr.isatty():
        return contextlib.nullcontext(lambda done, total: None)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    @contextlib.contextmanager
    def bar():
        with Progress(TextColumn("growing"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                      console=_console(stderr=True), transient=True) as p:
            task = p.add_task("grow", total=total)
            yield lambda done, _total: p.update(task, completed=done)

    return bar()


def cmd_sample(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="prepline sample", description="Build the sample corpus from real text that ships in packages.")
    ap.add_argument("--output", required=True, help="folder to write part-*.parquet and _truth/ into")
    ap.add_argument("--docs", type=int, default=None, help="number of documents (default: the bundled sample, a few thousand)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--files", type=int, default=8, help="number of Parquet files")
    ap.add_argument("--format", choices=("parquet", "warc"), default="parquet",
                    help="warc: the same documents as HTML pages of a web crawl (navigation, cookie banner, footer "
                         "around the text; a URL each) in 2 WARC files, for recipes that start from crawls "
                         "(pipelines/specs/fineweb.yaml)")
    ap.add_argument("--grow-from", default=None, metavar="SAMPLE",
                    help="make --docs documents as copies of this sample, each copy's words tagged so that copies are not "
                         "duplicates of each other (what --docs above 1,000,000 does with a base it builds; "
                         "src/prepline/sample/grow.py)")
    a = ap.parse_args(argv)
    from prepline.sample import build_sample
    from prepline.sample.grow import BASE_DOCS, GROW_ABOVE, grow_sample

    if a.format == "warc":
        import tempfile
        from pathlib import Path

        from prepline.sample.web import write_warc

        with tempfile.TemporaryDirectory() as tmp:
            info = build_sample(Path(tmp) / "s", docs=a.docs, seed=a.seed, files=a.files)
            web = write_warc(Path(tmp) / "s", a.output)
        _console().print(f"sample: {web['pages']:,} web pages (of {info['docs']:,} docs; the empty ones have no page) "
                         f"in {len(web['files'])} WARC files at {web['output']}")
        return 0
    if a.grow_from or (a.docs or 0) > GROW_ABOVE:
        import contextlib
        import tempfile
        from pathlib import Path

        if a.docs is None:
            raise SystemExit("prepline sample: --grow-from needs --docs (how many documents to make)")
        with contextlib.ExitStack() as stack:
            base = a.grow_from
            if base is None:  # the builder plans in memory (about 3 GB for a million): grow a base of a million
                parent = Path(a.output).resolve().parent
                parent.mkdir(parents=True, exist_ok=True)
                base = stack.enter_context(tempfile.TemporaryDirectory(prefix=".sample-base-", dir=parent))
                _console().print(f"sample: building a base of {BASE_DOCS:,} documents, then growing it to {a.docs:,}")
                build_sample(base, docs=BASE_DOCS, seed=a.seed, files=a.files)
            with _sample_progress(a.docs) as step:
                info = grow_sample(base, a.output, a.docs, progress=step)
        g = info["grown_from"]
        _console().print(f"sample: {info['docs']:,} docs in {info['files']} files ({info['bytes'] / 1e6:.1f} MB) at {info['output']}, "
                         f"{g['copies']} copies of a {g['docs']:,}-document sample")
        return 0
    info = build_sample(a.output, docs=a.docs, seed=a.seed, files=a.files)
    _console().print(f"sample: {info['docs']:,} docs in {info['files']} files ({info['bytes'] / 1e6:.1f} MB) at {info['output']}")
    _console().print("languages: " + ", ".join(f"{k} {v}" for k, v in sorted(info["langs"].items())))
    return 0


def cmd_plan(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="prepline plan", description=(
        "Size a super-pipeline run before renting a cluster: workers, memory per worker, dedup shards, S3 "
        "requests and bytes, and hours per stage, from the per-core rates the benchmarks measured (prepline.sizing; "
        "docs/scale.md)."))
    ap.add_argument("--docs", type=float, required=True, help="documents in the corpus (e.g. 10e9)")
    ap.add_argument("--bytes-per-doc", type=float, default=None, help="UTF-8 text bytes per document (default: the sample's, 1450)")
    ap.add_argument("--hours", type=float, default=24.0, help="deadline for the whole pipeline (default 24)")
    ap.add_argument("--worker-memory-gib", type=float, default=8.0, help="memory of one one-core Ray worker (default 8)")
    ap.add_argument("--file-mb", type=float, default=256.0, help="size of the corpus's Parquet files (default 256)")
    ap.add_argument("--cluster-start-s", type=float, default=120.0,
                    help="seconds to start one stage's cluster (an assumption, default 120: pods scheduled, image cached)")
    ap.add_argument("--add", default="", help="opt-in stages to add, comma-separated: url_filter,c4_clean,decontaminate,quality_classifier")
    ap.add_argument("--workers", type=int, default=0,
                    help="plan for this many workers per stage instead of the fewest that meet the deadline (what a fixed cluster takes)")
    ap.add_argument("--json", action="store_true", help="print the plan as JSON")
    a = ap.parse_args(argv)
    from prepline import sizing

    p = sizing.plan(a.docs, a.bytes_per_doc or sizing.SAMPLE_TEXT_BYTES, a.hours, a.worker_memory_gib, a.file_mb,
                    a.cluster_start_s, tuple(x.strip() for x in a.add.split(",") if x.strip()), workers=max(0, a.workers))
    if a.json:
        print(json.dumps({"docs": p.docs, "bytes_per_doc": p.bytes_per_doc, "hours": p.hours, "workers": p.workers, "files": p.files,
                          "wall_hours": round(p.wall_hours, 3), "stages": p.rows, "notes": p.notes}, indent=2))
        return 0
    print(f"{p.docs:,.0f} documents of {p.bytes_per_doc:,.0f} bytes, done in {p.hours:g} h: {p.workers:,} one-core workers per stage, "
          f"{p.verdict.replace('**', '')}\n")
    print(sizing.table_markdown(p))
    print()
    for n in p.notes:
        print(f"- {n}")
    return 0


def cmd_compile(argv: list[str]) -> int:
    from prepline import images, registry

    ap = argparse.ArgumentParser(prog="prepline compile",
                                 description="Compile every component and pipeline into compiled/, the Elyra catalog into "
                                             "elyra_templates/ and deploy/'s images into deploy/images/, every image from one "
                                             "registry and tag.")
    ap.add_argument("--output", default="compiled", help="folder of the KFP files (default: compiled/ in the current folder, e.g. the repository's)")
    ap.add_argument("--elyra-output", default="elyra_templates",
                    help="folder of the Elyra catalog and templates (default: elyra_templates/ in the current folder)")
    ap.add_argument("--deploy-output", default=images.DEPLOY_IMAGES,
                    help=f"folder of deploy/'s image settings, a kustomize component (default: {images.DEPLOY_IMAGES} in the current folder)")
    ap.add_argument("--registry", default=images.REGISTRY, help=f"image registry/prefix of the runtime images (default {images.REGISTRY})")
    ap.add_argument("--tag", default=images.VERSION, help=f"image tag (default {images.VERSION})")
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 when a generated file is stale")
    ap.add_argument("--builtins-only", action="store_true",
                    help="leave installed plug-in transforms out (what the repository's compiled/ and elyra_templates/ hold)")
    a = ap.parse_args(argv)
    from pathlib import Path

    from prepline.elyra_pipeline import sync as sync_elyra
    from prepline.kfp.compile import sync_compiled

    image_set = images.ImageSet(a.registry, a.tag)
    plugins = not a.builtins_only
    from prepline.gentree import as_written

    shown = (lambda ds: ds) if a.check else as_written  # once written, say so: not "missing:"
    diffs = shown(sync_compiled(Path(a.output), check=a.check, images=image_set, plugins=plugins))
    diffs += [f"elyra {d}" for d in shown(sync_elyra(Path(a.elyra_output), check=a.check, images=image_set, plugins=plugins))]
    diffs += [f"deploy {d}" for d in shown(images.sync_deploy(Path(a.deploy_output), check=a.check, images=image_set))]
    if plugins and (found := sorted(set(registry.names()) - set(registry.builtin_names()))):
        print("plug-ins included: " + ", ".join(f"{n} ({registry.origin(n).distribution})" for n in found))
    for d in diffs:
        print(d)
    if a.check and diffs:
        if plugins and found and not _compile_diffs(a, image_set, plugins=False):
            print(f"error: {a.output}/ and {a.elyra_output}/ hold the built-in transforms only; --check compared them with the "
                  f"installed plug-in(s) too ({', '.join(found)})\n  fix: prepline compile --check --builtins-only "
                  f"(your own catalog: prepline compile --output <folder> --elyra-output <folder>)", file=sys.stderr)
        else:
            print("error: compiled/, elyra_templates/ or deploy/images/ is stale\n  fix: run `prepline compile` and commit them", file=sys.stderr)
        return EXIT_FAILED
    if not a.check:
        print("images: " + ", ".join(f"{k} {v}" for k, v in image_set.all().items()))
    return 0


def _compile_diffs(a: argparse.Namespace, image_set, plugins: bool) -> list[str]:
    from pathlib import Path

    from prepline.elyra_pipeline import sync as sync_elyra
    from prepline.kfp.compile import sync_compiled

    return (sync_compiled(Path(a.output), check=True, images=image_set, plugins=plugins)
            + sync_elyra(Path(a.elyra_output), check=True, images=image_set, plugins=plugins))


def cmd_pipeline(argv: list[str]) -> int:
    from prepline.pipeline_cli import cmd_pipeline as run

    return run(argv)


def cmd_report(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="prepline report",
                                 description="Write the HTML report of a pipeline run (charts of every stage's documents, removals, "
                                             "languages, time and the training loss) from its run folder.")
    ap.add_argument("run", help="the run folder (a local path or s3:// URI): after `prepline pipeline run --local` it is "
                                "<--work-root>/stages/<run id>, e.g. runs/pipeline/stages/<run id>; on KFP, <work_root parameter>/<run id>")
    ap.add_argument("--output", default=None, help="where to write the HTML (default: <run>/report.html)")
    a = ap.parse_args(argv)
    from prepline.report import write_report
    from prepline.runs import stage_metadata

    if not stage_metadata(a.run):
        raise ConfigError(f"{a.run} holds no stage metadata.json (<stage>/metadata.json or lang=<code>/<stage>/metadata.json)",
                          "pass a run folder, <work_root>/<run id>, e.g. runs/pipeline/stages/<run id>")
    print(f"report: {write_report(a.run, a.output)}")
    return 0


def cmd_clusters(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="prepline clusters", description="List or sweep prepline's Ray clusters (leftovers of killed runs).")
    ap.add_argument("action", choices=("list", "sweep"))
    ap.add_argument("--provider", default="local", choices=("local", "kuberay"))
    ap.add_argument("--provider-json", default="{}", help='provider options, e.g. {"server": "http://kuberay-apiserver:8888"}')
    ap.add_argument("--namespace", default="", help="kuberay: the namespace of the clusters (default: provider_json's, else this pod's, else 'default')")
    ap.add_argument("--older-than", type=float, default=6.0, help="sweep: only clusters created more than this many hours ago (default 6)")
    ap.add_argument("--run", default=None, help="only clusters of this run id")
    ap.add_argument("--dry-run", action="store_true", help="sweep: say what would be deleted")
    a = ap.parse_args(argv)
    import datetime as dt

    from prepline.clusters import get_provider
    from prepline.clusters.base import LABEL_MANAGED, LABEL_RUN
    from prepline.stages import run_key

    try:
        opts = json.loads(a.provider_json)
    except json.JSONDecodeError:
        raise ConfigError("--provider-json is not valid JSON", '--provider-json \'{"server": "http://host:8888"}\'') from None
    p = get_provider(a.provider, **opts)
    labels = {LABEL_MANAGED: "true", **({LABEL_RUN: run_key(a.run)} if a.run else {})}
    clusters = p.list(a.namespace, labels)
    now = dt.datetime.now(dt.timezone.utc)
    rc = 0
    for c in clusters:
        age_h = (now - dt.datetime.fromisoformat(c.created)).total_seconds() / 3600 if c.created else float("inf")
        line = f"{c.name}\t{c.state}\t{age_h:.1f}h\trun={c.labels.get(LABEL_RUN, '?')}"
        if a.action == "sweep" and age_h >= a.older_than:
            if a.dry_run:
                print("would delete\t" + line)
            else:
                try:
                    p.delete(c.name, c.namespace)
                    print("deleted\t" + line)
                except PreplineError as e:
                    print(f"error: could not delete {c.name}: {e.message}", file=sys.stderr)
                    rc = EXIT_FAILED
        elif a.action == "list":
            print(line)
    return rc


def cmd_kfp(argv: list[str]) -> int:
    """``prepline kfp upload|run|clone|wait|terminate|list|logs`` (see prepline.kfp.cli); its own exit codes."""
    from prepline.kfp.cli import main as kfp_main

    return kfp_main(argv)


def _tokens_train(argv: list[str]) -> int:
    from prepline.tokens.shared import SharedTokenizerConfig, train_shared_tokenizer

    ap = argparse.ArgumentParser(prog="prepline tokens train-tokenizer",
                                 description="Train one byte-level BPE on a sample of every input (one folder per branch).")
    ap.add_argument("--input", action="append", required=True, help="a folder or s3:// URI of Parquet files; repeat per branch")
    ap.add_argument("--output", required=True, help="folder for tokenizer.json and tokenizer_train.json")
    ap.add_argument("--params", default=None, help="parameters as a JSON object (flags win)")
    _add_param_options(ap, SharedTokenizerConfig.params())
    a = ap.parse_args(argv)
    record = train_shared_tokenizer(a.input, a.output, params_from_args(a, SharedTokenizerConfig))
    for r in record["inputs"]:
        print(f"{r['input']}: {r['docs']:,} docs, {r['chars']:,} chars from {r['files_read']} of {r['files']} files")
    print(f"tokenizer: {record['vocab_size']:,} ids, trained on {record['train_chars']:,} chars "
          f"(sha256 {record['tokenizer_sha256'][:12]}) -> {a.output.rstrip('/')}/{record['tokenizer']}")
    return 0


def _tokens_data_path(argv: list[str]) -> int:
    from prepline.tokens.output import megatron_data_path

    ap = argparse.ArgumentParser(prog="prepline tokens data-path",
                                 description="Print Megatron-LM's --data-path (token count, prefix, ...) for tokenization outputs.")
    ap.add_argument("outputs", nargs="+", help="tokenization outputs (or their tokens/ folders)")
    print(megatron_data_path(ap.parse_args(argv).outputs))
    return 0


_TOKENS = {"train-tokenizer": _tokens_train, "data-path": _tokens_data_path}


def cmd_tokens(argv: list[str]) -> int:
    """``prepline tokens train-tokenizer|data-path``: the run-wide tokenizer; Megatron's --data-path."""
    if argv and argv[0] in _TOKENS:
        return _TOKENS[argv[0]](argv[1:])
    if argv and argv[0] in ("-h", "--help"):
        print(f"usage: prepline tokens {{{','.join(_TOKENS)}}} ...  (--help on each)")
        return 0
    raise ConfigError(f"prepline tokens needs an action ({', '.join(_TOKENS)})", "e.g. prepline tokens train-tokenizer --help")


def _quality_train(argv: list[str]) -> int:
    from prepline.quality import CARD_FILE, MODEL_FILE, QualityTrainConfig, train_quality_classifier

    ap = argparse.ArgumentParser(prog="prepline quality train",
                                 description="Train a fastText quality classifier (DCLM recipe) on positive vs negative documents; "
                                             "report held-out precision, recall and ROC AUC.")
    ap.add_argument("--positive", required=True, help="folder or s3:// URI of Parquet files: the high-quality (positive) documents")
    ap.add_argument("--negative", required=True, help="folder or s3:// URI of Parquet files: the other (negative) documents")
    ap.add_argument("--output", required=True, help=f"folder for {MODEL_FILE} and {CARD_FILE}")
    ap.add_argument("--params", default=None, help="parameters as a JSON object (flags win)")
    _add_param_options(ap, QualityTrainConfig.params())
    a = ap.parse_args(argv)
    card = train_quality_classifier(a.positive, a.negative, a.output, params_from_args(a, QualityTrainConfig))
    for role in ("positive", "negative"):
        d = card["data"][role]
        print(f"{role} {d['label']}: {d['used']:,} docs ({d['train']:,} train, {d['test']:,} held out) from {d['files']} files of {d['uri']}")
    m = card["held_out"]
    print(f"held out ({m['docs']:,} docs): precision {m['precision']:.4f}, recall {m['recall']:.4f} at p >= {m['threshold']}, "
          f"ROC AUC {m['roc_auc']:.4f}; trained in {card['train_seconds']:.2f} s"
          f"{'' if card['deterministic'] else ' (threads > 1: not reproducible)'}")
    print(f"model: {card['model_bytes']:,} bytes (sha256 {card['model_sha256'][:12]}) -> {a.output.rstrip('/')}/{MODEL_FILE}")
    return 0


_QUALITY = {"train": _quality_train}


def cmd_quality(argv: list[str]) -> int:
    """``prepline quality train``: a fastText quality classifier for the quality_classifier transform."""
    if argv and argv[0] in _QUALITY:
        return _QUALITY[argv[0]](argv[1:])
    if argv and argv[0] in ("-h", "--help"):
        print(f"usage: prepline quality {{{','.join(_QUALITY)}}} ...  (--help on each)")
        return 0
    raise ConfigError(f"prepline quality needs an action ({', '.join(_QUALITY)})", "e.g. prepline quality train --help")


COMMANDS = {
    "run": (cmd_run, "run a transform over a folder of Parquet files"),
    "list": (cmd_list, "list the transforms"),
    "describe": (cmd_describe, "show a transform's parameters"),
    "sample": (cmd_sample, "build the sample corpus"),
    "plan": (cmd_plan, "size a run: workers, memory, shards, S3 requests and hours per stage, from measured rates"),
    "compile": (cmd_compile, "compile the KFP components and pipelines into compiled/"),
    "clusters": (cmd_clusters, "list or sweep leftover Ray clusters by label and age"),
    "pipeline": (cmd_pipeline, "list pipelines, compile a pipeline spec, or run one locally (kfp.local + local Ray)"),
    "tokens": (cmd_tokens, "train one tokenizer for every branch; print Megatron's --data-path of token outputs"),
    "quality": (cmd_quality, "train a fastText quality classifier (for the quality_classifier transform)"),
    "report": (cmd_report, "write the HTML report of a pipeline run from its run folder"),
    "kfp": (cmd_kfp, "operate a KFP server: upload, run, clone, wait, list, logs (CI-friendly, --json)"),
}


def main(argv: list[str] | None = None) -> int:
    program = argv is None  # a command, not a call from Python
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    if debug:
        argv.remove("--debug")
    try:
        fmt = _take_option(argv, "--log-format")
        if program and argv[:1] == ["run"]:  # a transform runs: again with mimalloc preloaded, when installed (no return)
            from prepline.runtime import allocator

            allocator.reexec()
        logs.setup(fmt, debug=debug)
    except ConfigError as e:
        print(user_message(e), file=sys.stderr)
        return EXIT_USAGE
    if not argv or argv[0] in ("-h", "--help"):
        print(f"prepline {__version__}: LLM pre-training data preparation on Ray and Kubeflow Pipelines\n")
        print("usage: prepline [--debug] [--log-format text|json] <command> [options]   (prepline <command> --help for more)\n\ncommands:")
        for name, (_, helptext) in COMMANDS.items():
            print(f"  {name:<10} {helptext}")
        print("\n--debug: show the Python traceback of an error (exit codes: docs/reliability.md)")
        print(f"--log-format: prepline's log lines as text (default) or JSON lines (also {logs.ENV_FORMAT}=json)")
        return 0 if argv else EXIT_USAGE
    if argv[0] == "--version":
        print(__version__)
        return 0
    cmd = COMMANDS.get(argv[0])
    if cmd is None:
        print(f"error: unknown command '{argv[0]}'\n  fix: one of {', '.join(COMMANDS)}", file=sys.stderr)
        return EXIT_USAGE
    return run_command(cmd[0], argv[1:], debug)


def _take_option(argv: list[str], name: str) -> str | None:
    """Remove a global ``--name VALUE`` / ``--name=VALUE`` from ``argv``; its value."""
    for i, a in enumerate(argv):
        if a == name:
            if i + 1 >= len(argv):
                raise ConfigError(f"{name} needs a value", f"e.g. {name} json")
            value = argv[i + 1]
            del argv[i:i + 2]
            return value
        if a.startswith(name + "="):
            del argv[i]
            return a.split("=", 1)[1]
    return None


def run_command(fn, argv: list[str], debug: bool = False) -> int:
    """Run one command under the failure contract: an error prints ``error:`` and ``fix:`` (with the
    traceback only under --debug) and maps to its exit code (prepline.errors); SIGTERM stops the run
    like Ctrl-C does, so that it records what happened."""
    import signal
    import threading

    def on_term(signum, frame):
        raise Terminated("terminated (SIGTERM)", "rerun the same command to resume")

    old = signal.signal(signal.SIGTERM, on_term) if threading.current_thread() is threading.main_thread() else None
    try:
        return fn(argv)
    except BrokenPipeError:  # the reader of our output went away (`prepline plan ... | head`): not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the interpreter's own flush at exit does not fail again
        return 0
    except (Exception, KeyboardInterrupt) as e:  # noqa: BLE001 - the one place errors meet the user
        logs.flush_repeats()  # the repeats counted so far, before the error
        if debug:
            import traceback

            traceback.print_exception(e, file=sys.stderr)
        print(user_message(e), file=sys.stderr, flush=True)
        return exit_code(e)
    finally:
        logs.flush_repeats()
        if old is not None:
            signal.signal(signal.SIGTERM, old)


def console() -> NoReturn:
    """The ``prepline`` program."""
    exit_program(main())


def exit_program(code: int) -> NoReturn:
    """End the process with ``code``. A run stopped by an error or a signal may leave a task running
    in a thread (the driver's worker slot): the run has recorded its outcome by now, and Python's
    shutdown would end that thread inside native code and abort the process (exit -6 instead of
    143: :func:`prepline.runtime.local.tasks_running_in_threads`). Then the process leaves at once,
    after flushing its output and logs; its pool processes exit when they see their parent gone."""
    local = sys.modules.get("prepline.runtime.local")  # not imported: no task ran in this process
    ray = sys.modules.get("ray")
    # stopped by a signal: any native thread (an I/O or Arrow pool thread, not only a task) may still be
    # inside C++ code that Python's shutdown would unwind ("FATAL: exception not rethrown", exit -6; seen
    # under load in the fault suite's sigterm_driver); not when this process runs a local Ray (its shutdown)
    stopped = code in (EXIT_TERMINATED, EXIT_INTERRUPTED) and not (ray is not None and getattr(ray, "is_initialized", lambda: False)())
    if local is not None and (stopped or local.tasks_running_in_threads()):
        import logging

        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed pipe: nothing more to say
                pass
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    console()
