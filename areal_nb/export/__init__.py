"""Export a run to a self-contained folder that continues it as a batch job (torchrun, Slurm).

`session.export(path)` and `areal-nb export CONFIG --out DIR` both call `export_run`: capture.py
turns the agent into an import path or `agent.py`, folder.py writes config.yaml, train.py, the
launchers, requirements.txt, README.md and the checkpoint. A top layer beside the Session.
"""

from .capture import ExportError
from .folder import export_run

__all__ = ["ExportError", "export_run"]
