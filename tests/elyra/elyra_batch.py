"""Run several elyra-pipeline commands in one process of the Elyra environment (.venv-elyra).

    .venv-elyra/bin/python tests/elyra/elyra_batch.py '[["elyra-pipeline", "validate", ...], ["elyra-pipeline", "export", ...]]'

Each command goes through the entry point its script calls (.venv-elyra/bin/elyra-pipeline:
``elyra.cli.pipeline_app:pipeline``, a click group, run by click's own runner), in order; Elyra's import
(~10 s) and component cache are paid once instead of once per command. Prints one JSON object per
command: its exit code, its output and how long it took.
"""

from __future__ import annotations

import json
import sys
import time


def pipeline_cli(argv: list[str]) -> tuple[int, str]:
    from click.testing import CliRunner
    from elyra.cli.pipeline_app import pipeline

    r = CliRunner().invoke(pipeline, argv, prog_name="elyra-pipeline", catch_exceptions=True)
    out = r.output
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        out += f"\n{type(r.exception).__name__}: {r.exception}"  # what the script would print as a traceback
    return r.exit_code, out


CLIS = {"elyra-pipeline": pipeline_cli}


def main() -> None:
    for cli, *argv in json.loads(sys.argv[1]):
        t0 = time.time()
        code, out = CLIS[cli](argv)
        print(json.dumps({"argv": [cli, *argv], "code": code, "stdout": out, "seconds": round(time.time() - t0, 2)}), flush=True)


if __name__ == "__main__":
    main()
