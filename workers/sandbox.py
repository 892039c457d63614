"""The workflow sandbox with its glue code compiled once: the runner of BSO's workers (and the benchmark's).

The SDK's sandbox (temporalio 1.35) enters the sandbox by `exec` of a short source string: once per
activation, and once per payload sequence each time it encodes or decodes an activation's payloads (three
passes each way) to ask the workflow for its serialization context. `exec` of a string compiles it anew
every time: ~10% of the workflow side's CPU when replaying BSO's recorded histories, ~12% of a 1,000-story
sprint's worker in `bench.run --profile`. The strings are a handful of constants, so this runner compiles
each once; what runs, the restrictions, the importer and the instance are the SDK's own.

`_Instance` is private to the SDK: if a later SDK no longer has it, `workflow_runner()` returns the SDK's
runner as shipped (and says so in the log), and tests/workflow/test_sandbox_runner.py fails to point it out.
"""

from __future__ import annotations

import functools
import logging
from types import CodeType
from typing import Any

from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

try:
    from temporalio.worker.workflow_sandbox._runner import _Instance
except ImportError:  # pragma: no cover - an SDK that moved it: the shipped runner
    _Instance = None

log = logging.getLogger("bso.worker")


@functools.lru_cache(maxsize=32)
def compiled(source: str) -> CodeType:
    """`source` compiled as `exec` would (same file name, so tracebacks read the same)."""
    return compile(source, "<string>", "exec")


def _sdk_runs_code_strings() -> bool:
    return _Instance is not None and callable(getattr(_Instance, "_run_code", None))


if _sdk_runs_code_strings():

    class _CompiledOnceInstance(_Instance):
        def _run_code(self, code: str, **extra_globals: Any) -> None:
            super()._run_code(compiled(code), **extra_globals)  # exec takes a code object as it takes a string

    class CompiledOnceSandboxedWorkflowRunner(SandboxedWorkflowRunner):
        """`SandboxedWorkflowRunner` whose instances compile the sandbox's code strings once per process."""

        def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
            return _CompiledOnceInstance(det, self.runner_class, self.restrictions)


def workflow_runner() -> WorkflowRunner:
    """The runner for BSO's workers: the SDK's sandbox, with the code strings compiled once where possible."""
    if _sdk_runs_code_strings():
        return CompiledOnceSandboxedWorkflowRunner()
    log.warning("this temporalio has no sandbox _Instance._run_code: using the SDK's sandbox as shipped")
    return SandboxedWorkflowRunner()
