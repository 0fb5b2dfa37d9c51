"""The routing pieces of the SDK, without a daemon: targets, rendezvous, the table.

The behaviour over real channels is in `test_client_routing_wire.py`; over real
`tooljail serve` processes in `tests/integration/test_multi_daemon.py`.
"""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

from tooljail import Client, DaemonUnavailableError, InvalidRequestError, ShuttingDownError
from tooljail._client_base import _BaseClient
from tooljail._routing import (
    DaemonTable,
    Pins,
    never_reached,
    parse_targets,
    rendezvous_order,
    rendezvous_score,
)
from tooljail.errors import TransportError
from tooljail.v1 import tooljail_pb2 as pb

IDS = ("host-a:7070", "host-b:7070", "host-c:7070")
KEYS = [uuid.UUID(int=i).hex for i in range(3000)]


def _first(ids: tuple[str, ...]) -> Counter[str]:
    return Counter(rendezvous_order(key, ids)[0] for key in KEYS)


# --- rendezvous -------------------------------------------------------------------


def test_rendezvous_is_stable_across_calls_and_processes() -> None:
    # blake2b of the key and the id: no per-process salt, so these never change.
    assert rendezvous_order("call-1", IDS) == rendezvous_order("call-1", reversed(IDS))
    assert rendezvous_score("call-1", "host-a:7070") == int.from_bytes(
        __import__("hashlib").blake2b(b"call-1\x00host-a:7070", digest_size=8).digest(), "big"
    )


def test_rendezvous_spreads_evenly_over_three_daemons() -> None:
    counts = _first(IDS)
    assert set(counts) == set(IDS)
    for daemon_id in IDS:
        assert abs(counts[daemon_id] - 1000) <= 100, counts


def test_removing_a_daemon_moves_only_its_share() -> None:
    before = {key: rendezvous_order(key, IDS)[0] for key in KEYS}
    after = {key: rendezvous_order(key, IDS[:2])[0] for key in KEYS}
    moved = [key for key in KEYS if before[key] != after[key]]
    assert moved and all(before[key] == IDS[2] for key in moved)
    assert len(moved) == Counter(before.values())[IDS[2]]


# --- targets ------------------------------------------------------------------------


def test_one_plain_target_is_not_routed() -> None:
    targets = parse_targets("host:7070", _BaseClient._normalize_target)
    assert (targets.addresses, targets.routed) == (("host:7070",), False)


def test_a_list_is_routed_and_normalised(tmp_path) -> None:
    targets = parse_targets(
        ["host-a:7070", str(tmp_path / "b.sock"), f"unix://{tmp_path}/c.sock"],
        _BaseClient._normalize_target,
    )
    assert targets.routed
    assert targets.addresses == (
        "host-a:7070",
        f"unix://{tmp_path}/b.sock",
        f"unix://{tmp_path}/c.sock",
    )
    assert parse_targets(("h:1",), _BaseClient._normalize_target).routed


@pytest.mark.parametrize(
    ("given", "name"),
    [
        ("dns:///tooljail.ns.svc.cluster.local:7070", "tooljail.ns.svc.cluster.local:7070"),
        ("dns://8.8.8.8/tooljail:7070", "tooljail:7070"),
        ("dns:tooljail:7070", "tooljail:7070"),
    ],
)
def test_a_dns_name_is_resolved_by_the_sdk(given: str, name: str) -> None:
    targets = parse_targets(given, _BaseClient._normalize_target)
    assert (targets.addresses, targets.dns_name, targets.routed) == ((), name, True)
    assert targets.display == f"dns:///{name}"


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ([], "empty"),
        (["h:1", "h:1"], "listed twice"),
        (["h:1", "dns:///x:1"], "stands alone"),
        ("dns:///noport", "port"),
        (["h:1", ""], "empty"),
    ],
)
def test_unusable_targets_are_refused_before_anything_is_sent(given, says: str) -> None:
    with pytest.raises(InvalidRequestError, match=says):
        Client(given)


def test_a_target_of_another_type_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        Client({"h:1"})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Client(["h:1", 7])  # type: ignore[list-item]


def test_a_routed_client_names_its_targets() -> None:
    with Client(["h-a:1", "h-b:2"]) as client:
        assert client.target == "h-a:1,h-b:2"


# --- the table ----------------------------------------------------------------------


def _table(*addresses: str) -> DaemonTable:
    table = DaemonTable()
    for address in addresses:
        table.add(address, channel=None, stub=None)
    return table


def test_two_daemons_with_one_id_is_an_error_naming_both_targets() -> None:
    table = _table("h-a:1", "h-b:1")
    a, b = table.daemons
    table.note_info(a, pb.DaemonInfo(daemon_id="same"))
    with pytest.raises(InvalidRequestError, match=r"'same'.*h-a:1 and h-b:1"):
        table.note_info(b, pb.DaemonInfo(daemon_id="same"))
    assert table.config_error is not None


def test_a_daemon_that_moved_is_not_a_duplicate() -> None:
    # A pod rescheduled under the same name at a new address: the old one is gone.
    table = _table("10.0.0.1:1", "10.0.0.2:1")
    old, new = table.daemons
    table.note_info(old, pb.DaemonInfo(daemon_id="pod-0"))
    table.note_failure(old, DaemonUnavailableError("refused", status="UNAVAILABLE"))
    table.note_info(new, pb.DaemonInfo(daemon_id="pod-0"))
    assert table.config_error is None


def test_only_serving_daemons_rank_for_new_calls() -> None:
    table = _table("h-a:1", "h-b:1", "h-c:1")
    a, b, c = table.daemons
    table.note_info(a, pb.DaemonInfo(daemon_id="a"))
    table.note_info(b, pb.DaemonInfo(daemon_id="b", draining=True))
    table.note_info(c, pb.DaemonInfo(daemon_id="c"))
    table.note_failure(c, DaemonUnavailableError("refused", status="UNAVAILABLE"))
    assert table.ranked("k", serving=True) == [a]
    assert {d.daemon_id for d in table.ranked("k", serving=False)} == {"a", "b", "c"}
    message = str(_table_without_serving(table))
    assert "'b' (h-b:1): draining" in message and "'c' (h-c:1): unreachable" in message


def _table_without_serving(table: DaemonTable) -> TransportError:
    table.note_failure(table.daemons[0], ShuttingDownError("draining"))
    assert table.ranked("k", serving=True) == []
    return table.none_serving()


def test_a_draining_refusal_marks_the_daemon_draining_not_unreachable() -> None:
    table = _table("h-a:1")
    (a,) = table.daemons
    table.note_info(a, pb.DaemonInfo(daemon_id="a"))
    table.note_failure(a, ShuttingDownError("draining"))
    assert (a.reachable, a.draining, a.serving) == (True, True, False)
    table.note_info(a, pb.DaemonInfo(daemon_id="a", started_unix=2.0))  # restarted
    assert a.serving


# --- what may go elsewhere ------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "elsewhere"),
    [
        (ShuttingDownError("draining"), True),
        (
            DaemonUnavailableError(
                "failed to connect to all addresses; last error: UNKNOWN: "
                "unix:/s.sock: Connection refused",
                status="UNAVAILABLE",
            ),
            True,
        ),
        (DaemonUnavailableError("Socket closed", status="UNAVAILABLE"), False),
        (DaemonUnavailableError("recvmsg:Connection reset by peer", status="UNAVAILABLE"), False),
        (TransportError("Deadline Exceeded", status="DEADLINE_EXCEEDED"), False),
    ],
)
def test_only_a_request_no_daemon_had_may_go_to_another(error, elsewhere: bool) -> None:
    assert never_reached(error) is elsewhere


def test_pins_forget_the_least_recently_used_first() -> None:
    pins: Pins[str, int] = Pins(capacity=2)
    pins.put("a", 1)
    pins.put("b", 2)
    assert pins.get("a") == 1  # a is now the most recent
    pins.put("c", 3)
    assert (pins.get("a"), pins.get("b"), pins.get("c"), len(pins)) == (1, None, 3, 2)
