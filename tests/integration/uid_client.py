"""A client run as another uid by tests/integration/test_uid_identity.py.

`python uid_client.py TARGET ACTION [ARG]` prints one JSON object. It imports
only the SDK (tooljail) and grpc: it runs under the system interpreter with
the test venv's site-packages on its path, as a uid that cannot reach the venv.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from typing import Any

from tooljail import Client, TooljailError

SECRET = "secret-of-this-uid"


def own(target: str) -> dict[str, Any]:
    """Leave work behind: an open session (a variable, a file), a call, an artifact."""
    with Client(target, client_name="owner") as client:
        session = client.session()
        result = session.call("execute_python_code", {"code": f"x = {SECRET!r}"})
        assert result.ok, result
        session.upload("secret.txt", SECRET.encode())
        write = (
            "import os\nos.makedirs('outputs', exist_ok=True)\n"
            f"open('outputs/a.txt', 'w').write({SECRET!r})\n"
        )
        made = client.call("execute_python_code", {"code": write})
        assert made.ok and made.artifacts, made
        mine = client.list_sessions(all_clients=True)
        return {
            "session_id": session.id,
            "call_id": made.call_id,
            "artifact_id": made.artifacts[0].artifact_id,
            "sessions_seen": [s.session_id for s in mine],
            "artifacts_seen": [a.artifact_id for a in client.list_artifacts()],
        }


def _try(action: Any) -> str:
    try:
        return f"ok: {action()!r}"
    except TooljailError as exc:
        return f"{type(exc).__name__}: {exc}"


def probe(target: str, ids: dict[str, str]) -> dict[str, Any]:
    """Try to see, read and close another's work, under a name that claims to be theirs."""
    sid, cid, aid = ids["session_id"], ids["call_id"], ids["artifact_id"]
    with Client(target, client_name="owner") as client:
        return {
            "sessions_seen": [s.session_id for s in client.list_sessions(all_clients=True)],
            "artifacts_seen": [a.artifact_id for a in client.list_artifacts()],
            "session_call": _try(
                lambda: client.call("execute_python_code", {"code": "print(x)"}, session_id=sid)
            ),
            "download": _try(lambda: client.download_file(sid, "secret.txt")),
            "upload": _try(lambda: client.upload_file(sid, "planted.txt", b"x")),
            "get_call": _try(lambda: client.get_call(cid)),
            "attach": _try(lambda: list(client.attach(cid))),
            "cancel": _try(lambda: client.cancel(cid)),
            "get_artifact": _try(lambda: client.get_artifact(aid)),
            "delete_artifact": _try(lambda: client.delete_artifact(aid)),
            "close_session": _try(lambda: client.close_session(sid)),
            "read_artifact_tool": _try(
                lambda: client.call("read_artifact", {"artifact_id": aid}).model_dump_json()
            ),
        }


def history(target: str, other: str) -> dict[str, Any]:
    """Make two calls, then list calls: its own, and (refused) the uid `other`'s."""
    with Client(target, client_name="owner") as client:
        made = [client.call("list_artifacts", {}).call_id for _ in range(2)]
        return {
            "made": made,
            "seen": [c.call_id for c in client.list_calls(limit=1000).calls],
            "named_other": _try(lambda: client.list_calls(client_name=other)),
        }


def sessions(target: str, most: int) -> dict[str, Any]:
    """Open sessions under a new client name each time until refused (or `most`)."""
    opened: list[str] = []
    refused = ""
    for n in range(most):
        with Client(target, client_name=f"rotating-{n}", retries=0) as client:
            try:
                opened.append(client.session().id)
            except TooljailError as exc:
                refused = f"{type(exc).__name__}: {exc}"
                break
    return {"opened": opened, "refused": refused}


def connections(target: str, count: int) -> dict[str, Any]:
    """Open `count` raw connections at once; how many the daemon serves (it speaks
    first: its HTTP/2 settings) and how many it closes at once."""
    path = target.removeprefix("unix://")
    held: list[socket.socket] = []
    served = closed = 0
    for _ in range(count):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        held.append(sock)
    for sock in held:
        sock.settimeout(5)
        try:
            data = sock.recv(64)
        except OSError:
            data = b""
        if data:
            served += 1
        else:
            closed += 1
    print(json.dumps({"served": served, "closed": closed}), flush=True)
    # Held open until told (stdin closes), so the test can act meanwhile.
    sys.stdin.read()
    for sock in held:
        sock.close()
    return {}


def main() -> None:
    target, action = sys.argv[1], sys.argv[2]
    arg = sys.argv[3] if len(sys.argv) > 3 else ""
    started = time.monotonic()
    if action == "own":
        out = own(target)
    elif action == "probe":
        out = probe(target, json.loads(arg))
    elif action == "history":
        out = history(target, arg)
    elif action == "sessions":
        out = sessions(target, int(arg))
    elif action == "connections":
        connections(target, int(arg))
        return
    else:
        raise SystemExit(f"unknown action {action}")
    out["seconds"] = time.monotonic() - started
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
