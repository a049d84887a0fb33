"""The base class of every config section: a pydantic model that refuses unknown keys."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    # Unknown keys are errors (with a did-you-mean); values are checked when assigned too.
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
