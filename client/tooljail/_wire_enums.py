"""Enum tables between the SDK's types and the wire: the two helpers every converter shares."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

__all__ = ["from_pb", "invert"]

_K = TypeVar("_K")


def invert(table: Mapping[_K, int]) -> dict[int, _K]:
    # Keyed by plain int: a message field reads back as an int, possibly one this
    # SDK has no name for.
    inverted = {int(v): k for k, v in table.items()}
    if len(inverted) != len(table):
        # A duplicate wire value would silently make one direction lossy.
        raise RuntimeError("enum table is not one-to-one")
    return inverted


def from_pb(table: Mapping[int, _K], value: int, enum_name: str) -> _K:
    try:
        return table[value]
    except KeyError:
        raise ValueError(f"unknown or unset tooljail.v1.{enum_name} value {value}") from None
