"""The model's tool-call id as a call id: `<client name>:<id>`, mapped to the daemon's
shape (1 to 128 of A-Za-z0-9._:-) deterministically, two ids never mapped alike."""

from __future__ import annotations

import re

import pytest

from tooljail.integrations._ids import namespaced

CALL_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def test_an_id_of_the_daemons_shape_is_kept_as_is() -> None:
    assert namespaced("host-a", "call_abc123") == "host-a:call_abc123"
    assert (
        namespaced("agent", "toolu_01A09q90qw90lq917835lq9")
        == "agent:toolu_01A09q90qw90lq917835lq9"
    )


@pytest.mark.parametrize(
    ("client", "framework_id"),
    [
        ("myhost/4242", "call_1"),  # the SDK's default client name has a "/"
        ("agent", "call 1"),
        ("agent", "é-id"),
        ("agent", "x" * 300),
        ("a" * 200, "call_1"),
        ("agent", "fc_" + "\u2028" * 3),
    ],
)
def test_other_ids_are_mapped_deterministically_into_the_daemons_shape(
    client: str, framework_id: str
) -> None:
    mapped = namespaced(client, framework_id)
    assert CALL_ID.fullmatch(mapped), mapped
    assert mapped == namespaced(client, framework_id)
    assert re.search(r"-[0-9a-f]{16}$", mapped)


def test_ids_that_map_to_the_same_characters_still_differ() -> None:
    assert namespaced("agent", "call/1") != namespaced("agent", "call 1")
    assert namespaced("agent", "x" * 300) != namespaced("agent", "x" * 301)
    assert namespaced("a/b", "c") != namespaced("a", "b/c")
