"""What a view shows, read from whatever the user hands it.

Views accept an `Episode`, a `RolloutBatch`, an `InteractionCache` (or any id → interaction
dict), a list of interactions, a Session, or a zero-argument callable returning one of those
(re-read on every refresh, which is how views stay live). Only attributes are read here, so
this module imports nothing from the layers it reads (duck typing keeps widgets a leaf).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from areal_nb.errors import ArgumentTypeError

# Where the capture layer may keep the reward as it was set, before any discount.
_RAW_REWARD_ATTRS = ("raw_reward", "original_reward")


def resolve_source(source: Any) -> Any:
    return source() if callable(source) and not _is_data(source) else source


def _is_data(obj: Any) -> bool:
    return isinstance(obj, Mapping | list | tuple) or hasattr(obj, "interactions") or hasattr(obj, "episodes")


def collect_interactions(source: Any) -> list[Any]:
    """All interactions of `source` in insertion order, in-flight calls included, no duplicates."""
    source = resolve_source(source)
    found: list[Any] = []
    if source is None:
        return found
    if hasattr(source, "proxy_caches"):  # a Session: the live caches, else its latest batch
        caches = source.proxy_caches() or {}
        for cache in caches.values() if isinstance(caches, Mapping) else caches:  # {session id: cache}
            if cache is not None:
                found.extend(list(cache.values()))
        if not found and getattr(source, "last_batch", None) is not None:
            found = collect_interactions(source.last_batch)
    elif hasattr(source, "episodes"):  # a RolloutBatch
        for episode in source.episodes:
            found.extend(collect_interactions(episode))
    elif hasattr(source, "interactions") and not isinstance(source, Mapping):  # an Episode
        found.extend(list((source.interactions or {}).values()))
    elif isinstance(source, Mapping):
        found.extend(list(source.values()))
    elif isinstance(source, list | tuple):  # interactions, or episodes / caches to flatten
        for item in source:
            found.extend([item] if hasattr(item, "model_response") else collect_interactions(item))
    elif hasattr(source, "model_response"):  # a single interaction
        found.append(source)
    else:
        raise ArgumentTypeError(
            "expected an Episode, RolloutBatch, InteractionCache, dict or list of interactions, a "
            f"Session, or a callable returning one; got {type(source).__name__}"
        )
    seen: set[int] = set()
    unique = []
    for item in found:
        if id(item) not in seen:
            seen.add(id(item))
            unique.append(item)
    return unique


def is_complete(interaction: Any) -> bool:
    return interaction.output_message_list is not None and interaction.interaction_id is not None


def raw_reward(interaction: Any) -> float | None:
    """The reward as it was set (before discount), where the capture layer records it."""
    for name in _RAW_REWARD_ATTRS:
        value = getattr(interaction, name, None)
        if value is not None:
            return float(value)
    return None


def snapshot_key(source: Any) -> tuple:
    """A cheap fingerprint: changes when calls arrive, complete, or get rewards."""
    items = collect_interactions(source)
    return tuple(
        (id(x), is_complete(x), x.reward, raw_reward(x), x.model_response is not None) for x in items
    )


def node_key(interaction: Any, index: int) -> str:
    """A stable display id; in-flight calls may not have an id yet."""
    return interaction.interaction_id or f"pending-{index}"
