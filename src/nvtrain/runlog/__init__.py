"""What a run's events log says, worked out once: ``report``, ``tune-interval --from-run`` and
the live metrics all read a run through ``RunLog``.

``read_log`` finds and reads the log (``files``: one run's events only, ``RunEvents.left_out``
lists another run's found there); ``RunLog`` (``log``) orders its typed records
(``nvtrain.events.records``) by time and works out, each on first use:

* ``recoveries`` (``recoveries``): the faults and restarts before each first completed step of
  an attempt form one ``Recovery``, from the earliest of them to that step: how the workers came
  back (``layer``: the same processes or new ones), the restarts it took (in_process, in_job,
  launcher, pod), its cause (in words, and as one of ``CAUSES``), its milestones and the
  checkpoint it loaded.
* ``stretches`` (``steps``): the events between two recoveries' first completed steps (one
  attempt, every rank merged), with their logged steps and the time per step between them;
  ``step_times``, the step times the workers logged.
* ``commits``, ``saves``, ``save_blocks``, ``save_writes``, ``save_waits``, ``loads``
  (``checkpoints``; ``loads_by_origin`` and ``recovery_origins`` split the loads and the
  recoveries by where they read from).
* the run's ``run_id``, ``nodes``, ``ranks``, ``exit_code``, ``last_worker_ts``, ``ended``.

Nothing here reads a bare dict or raises on odd values: every record was type-checked when it
was parsed (``nvtrain.events.records.from_fields``).
"""

from nvtrain.runlog.checkpoints import ORIGINS, WAITED, Origin, Saves, loads_by_origin, recovery_origins
from nvtrain.runlog.files import (
    EVENTS_FILE,
    LeftOut,
    RunEvents,
    RunTail,
    log_files,
    pod_events_file,
    pod_files,
    read_log,
)
from nvtrain.runlog.kinds import restore_origin
from nvtrain.runlog.log import RunLog
from nvtrain.runlog.recoveries import CAUSES, Cause, Layer, Recovery
from nvtrain.runlog.steps import Stretch

__all__ = [
    "CAUSES",
    "EVENTS_FILE",
    "ORIGINS",
    "WAITED",
    "Cause",
    "Layer",
    "LeftOut",
    "Origin",
    "Recovery",
    "RunEvents",
    "RunLog",
    "RunTail",
    "Saves",
    "Stretch",
    "loads_by_origin",
    "log_files",
    "pod_events_file",
    "pod_files",
    "read_log",
    "recovery_origins",
    "restore_origin",
]
