"""What a local pipeline run leaves behind of kfp.local's output handling (prepline.kfp.local_tasks)."""

from __future__ import annotations

import builtins

from prepline.kfp.local_tasks import task_output


def test_print_is_itself_again_after_tasks_that_overlapped():
    """kfp.local indents a task's output by swapping builtins.print and putting back what it found;
    two ParallelFor iterations at once interleave like this and leave an indenting print behind
    (then the run's closing 'report: <path>' line came out indented). The run's end restores it."""
    from kfp.local import logging_utils

    real = builtins.print
    with task_output():
        first, second = logging_utils.indented_print(), logging_utils.indented_print()
        first.__enter__()
        second.__enter__()
        first.__exit__(None, None, None)
        second.__exit__(None, None, None)
        assert builtins.print is not real  # what kfp.local alone leaves
    assert builtins.print is real
