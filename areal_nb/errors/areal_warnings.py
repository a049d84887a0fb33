"""`ArealWarning` and its kinds: what areal_nb warns about (`warnings.warn`), never raises."""

from __future__ import annotations


class ArealWarning(UserWarning):
    """The base of every warning areal_nb issues."""


class ConversationLinkWarning(ArealWarning):
    """A call looks like a continuation but is not linked as one: an edited assistant message, or
    (concat mode) tools or template variables that differ from the parent's."""


class MissingRewardWarning(ArealWarning):
    """A reward discount found calls whose reward was never set (they count as 0.0)."""


class IncompleteInteractionWarning(ArealWarning):
    """An export skipped calls that have not returned."""


class NoLearningSignalWarning(ArealWarning):
    """Most groups of a training step had equal rewards in every episode: their advantages are 0
    and they teach nothing. The message says what to try."""
