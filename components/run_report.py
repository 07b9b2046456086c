"""The run_report component: the HTML report of a pipeline run, as a KFP ``HTML`` artifact.

A thin, typed KFP lightweight component (like :mod:`prepline.components.ray_stage`): its body calls
:func:`prepline.report.write_report`, where the logic lives and is tested without KFP. It runs in the
launcher image, last in the super pipeline; the KFP UI shows the artifact as a page.
"""

from kfp import dsl
from kfp.dsl import HTML, Output

from prepline.images import LAUNCHER_IMAGE

_component = dsl.component(base_image=LAUNCHER_IMAGE, install_kfp_package=False)


@_component
def run_report(work_root: str, run_id: str, report: Output[HTML]) -> str:
    """Write the run's report (documents per stage and branch, removals by reason, the language mix,
    time per stage, the training loss, a link to every stage's metadata.json) from the stages'
    metadata.json under <work_root>/<run>: into the HTML artifact and next to the stages as
    report.html. Returns where that copy is."""
    from prepline.report import run_folder, write_report

    run = run_folder(work_root, run_id)
    write_report(run, report.path)
    return write_report(run)


COMPONENTS = {"run_report": run_report}
