"""What `Client` and `AsyncClient` share: targets and `_BaseClient`, no I/O.

`_BaseClient` holds target normalisation, argument checks, request building
and decoding, and hands its router a `ClientLink` (metadata, credentials,
the retry policy). What each method sends and how it reads the answer is a
flow of `_ClientPlans` (`tooljail._client_plans`); `Client` and `AsyncClient`
only run those flows, so a fix to the logic is made once for both.
"""

from __future__ import annotations

import json
import math
import os
import socket
import uuid
import warnings
from collections.abc import Sequence
from typing import Any

import grpc

from tooljail._call_types import CallInfo
from tooljail._credentials import Credentials
from tooljail._link import (
    ClientLink,
    backoff_s,
    decode_event,
    decode_result,
    no_result_error,
    protocol_error,
    renamed_keyword,
)
from tooljail._router_base import RouterBase
from tooljail._routing import Targets, parse_targets
from tooljail._session_base import check_names, check_session_id
from tooljail._types import CallState, Diagnostic, ToolInfo
from tooljail._wire import (
    call_info_from_proto,
    call_state_from_proto,
    diagnostic_from_proto,
    tool_info_from_proto,
)
from tooljail.common import default_socket_path
from tooljail.errors import (
    BadTimeoutError,
    InvalidRequestError,
    TooljailError,
)
from tooljail.v1 import tooljail_pb2 as pb

__all__ = [
    "CLIENT_ENV",
    "CLIENT_KEY",
    "MAX_RECEIVE_MESSAGE_BYTES",
    "TARGET_ENV",
    "default_socket_path",
    "default_target",
]

CLIENT_KEY = "tooljail-client"
"""Metadata naming this client to the daemon: its share of calls, the owner of
its sessions' listing and of the artifacts its calls make."""

CLIENT_ENV = "TOOLJAIL_CLIENT"
"""Environment variable naming the client when `client_name` is not given."""

MAX_CLIENT_NAME = 128
"""The daemon reads at most this many characters of a client's name."""

TARGET_ENV = "TOOLJAIL_TARGET"
"""Environment variable naming the daemon to dial when no target is given."""

MAX_RECEIVE_MESSAGE_BYTES = 64 * 1024 * 1024
"""Largest message the SDK accepts (a result carries a tool's whole data)."""

# Target schemes gRPC resolves itself; anything else with "://" is a mistake such
# as "http://host:port", which gRPC would only reject later and obscurely.
_GRPC_SCHEMES = frozenset({"unix", "unix-abstract", "dns", "ipv4", "ipv6", "vsock"})


def default_target() -> str:
    """The daemon a client dials when it is given no target.

    Returns:
        The TOOLJAIL_TARGET environment variable when set, else
        `unix://` + `default_socket_path()`.
    """
    env = os.environ.get(TARGET_ENV, "").strip()
    if env:
        return env
    return f"unix://{default_socket_path()}"


class _BaseClient:
    """What `Client` and `AsyncClient` share: everything that does no I/O.

    Its arguments are `Client`'s (documented there). A subclass makes its
    router (`_new_router`); the base alone opens no channel.
    """

    _router: RouterBase
    _target: str
    _targets: Targets
    _rpc_timeout_s: float | None
    _retries: int

    def __init__(
        self,
        target: str | list[str] | tuple[str, ...] | None = None,
        *,
        rpc_timeout_s: float | None = None,
        retries: int = 3,
        client_name: str | None = None,
        token: str | None = None,
        tls_ca_file: str | os.PathLike[str] | None = None,
        tls_cert_file: str | os.PathLike[str] | None = None,
        tls_key_file: str | os.PathLike[str] | None = None,
        timeout: float | None = None,
    ) -> None:
        self._targets = parse_targets(
            default_target() if target is None else target, self._normalize_target
        )
        self._target = self._targets.display
        rpc_timeout_s = renamed_keyword("timeout", "rpc_timeout_s", rpc_timeout_s, timeout)
        self._rpc_timeout_s = self._check_seconds(
            rpc_timeout_s, "rpc_timeout_s", InvalidRequestError
        )
        if isinstance(retries, bool) or not isinstance(retries, int):
            raise TypeError(f"retries must be an int, got {retries!r}")
        if retries < 0:
            raise InvalidRequestError(f"retries must be 0 or more, got {retries}")
        self._retries = retries
        self._client_name = self._resolve_client_name(client_name)
        # Who we are: the daemon's fairness between agent hosts, and the owner
        # of what our calls make (artifacts).
        self._credentials = Credentials.resolve(token, tls_ca_file, tls_cert_file, tls_key_file)
        self._metadata = ((CLIENT_KEY, self._client_name), *self._credentials.metadata())
        # All the router sees of this client.
        self._link = ClientLink(
            self._target, self._metadata, self._rpc_timeout_s, retries, self._open_channel
        )
        router = self._new_router()
        if router is not None:
            self._router = router
            if not self._targets.routed:
                self._channel, self._stub = self._router.table.daemons[0].channel_and_stub

    def _new_router(self) -> RouterBase | None:
        """The router that sends this client's requests (`self._link`); None: none."""
        return None

    @staticmethod
    def _resolve_client_name(client_name: str | None) -> str:
        """The name this client goes by: `client_name`, else $TOOLJAIL_CLIENT,
        else "<host>/<pid>" (a name of this process alone).

        Raises:
            TypeError: When `client_name` is not a str (or None).
            InvalidRequestError: When the name (given or from the environment) is
                empty, longer than 128 characters, or not printable ASCII (gRPC
                metadata carries nothing else).
        """
        where = "client_name"
        if client_name is None:
            client_name = os.environ.get(CLIENT_ENV, "").strip()
            if not client_name:
                return f"{socket.gethostname()}/{os.getpid()}"
            where = f"${CLIENT_ENV}"
        if not isinstance(client_name, str):
            raise TypeError(f"client_name must be a str, got {type(client_name).__name__}")
        if not client_name or len(client_name) > MAX_CLIENT_NAME:
            raise InvalidRequestError(
                f"{where} must be 1 to {MAX_CLIENT_NAME} characters, got {len(client_name)}"
            )
        if not (client_name.isascii() and client_name.isprintable()):
            raise InvalidRequestError(
                f"{where} must be printable ASCII (it travels as gRPC metadata), "
                f"got {client_name[:40]!r}"
            )
        return client_name

    @staticmethod
    def _check_seq(from_seq: int) -> int:
        if isinstance(from_seq, bool) or not isinstance(from_seq, int):
            raise TypeError(f"from_seq must be an int, got {from_seq!r}")
        if from_seq < 0:
            raise InvalidRequestError(f"from_seq must be 0 or more, got {from_seq}")
        return from_seq

    # --- retries ---

    @staticmethod
    def _new_call_id() -> str:
        """An id for a call the caller gave none: retries send the same one."""
        return uuid.uuid4().hex

    def _should_retry(self, error: TooljailError, attempt: int) -> bool:
        """The retry policy (`ClientLink.should_retry`): after `error`, try again?"""
        return self._link.should_retry(error, attempt)

    _backoff_s = staticmethod(backoff_s)

    @property
    def target(self) -> str:
        """The gRPC target this client dials, normalised (e.g. "unix:///run/x.sock");
        over many daemons, their addresses joined by "," or the dns:/// name."""
        return self._target

    @property
    def client_name(self) -> str:
        """The name this client sends the daemon (`tooljail-client` metadata)."""
        return self._client_name

    @property
    def rpc_timeout_s(self) -> float | None:
        """The deadline in seconds of each try of a unary RPC; None means no deadline."""
        return self._rpc_timeout_s

    @property
    def timeout(self) -> float | None:
        """Deprecated: the old name of `rpc_timeout_s`."""
        warnings.warn(
            "Client.timeout is deprecated: it is now called rpc_timeout_s",
            DeprecationWarning,
            stacklevel=2,
        )
        return self._rpc_timeout_s

    def __repr__(self) -> str:
        name, timeout = type(self).__name__, self._rpc_timeout_s
        return f"{name}(target={self._target!r}, rpc_timeout_s={timeout!r})"

    # --- target and channel ---

    @staticmethod
    def _normalize_target(target: str) -> str:
        """A gRPC target from what a user may write.

        Accepts "unix:///abs/path", "unix:/abs", "unix:relative" (made absolute),
        a bare path ("/x/y.sock", "./y.sock", "~/y.sock"), "host:port", and any
        target with a scheme gRPC resolves ("dns:///h:p", "ipv4:...", ...).

        Raises:
            TypeError: When the target is not a string.
            InvalidRequestError: When the target is empty or cannot name a daemon.
        """
        if not isinstance(target, str):
            raise TypeError(f"target must be a str, got {type(target).__name__}")
        t = target.strip()
        if not t:
            raise InvalidRequestError("target is empty: give a socket path or host:port")
        if t.startswith(("/", "./", "../", "~")):
            return "unix://" + os.path.abspath(os.path.expanduser(t))
        scheme, sep, rest = t.partition(":")
        if sep and scheme == "unix":
            if rest.startswith("//"):
                path = rest[2:]
                if not path.startswith("/"):
                    raise InvalidRequestError(
                        f"target {target!r}: unix:// needs an absolute path "
                        "(three slashes: unix:///path/to.sock)"
                    )
                return t
            if not rest:
                raise InvalidRequestError(f"target {target!r} names no socket path")
            return "unix://" + os.path.abspath(os.path.expanduser(rest))
        if sep and scheme.lower() in _GRPC_SCHEMES:
            return t
        if "://" in t:
            raise InvalidRequestError(
                f"target {target!r}: unsupported scheme {scheme!r}; use host:port, "
                "a socket path, or unix:///path/to.sock"
            )
        return t

    def _open_channel(self, module: Any, address: str) -> Any:
        """A channel of `module` (grpc or grpc.aio) to one daemon's address: TLS
        when the credentials ask for it, else plaintext (the default target is a
        Unix socket guarded by its file modes)."""
        options = self._channel_options()
        if self._targets.routed:
            # gRPC backs off reconnecting up to 2 minutes; a daemon restarted by a
            # rollout must take calls again within a health interval or two.
            options += [
                ("grpc.initial_reconnect_backoff_ms", 250),
                ("grpc.min_reconnect_backoff_ms", 250),
                ("grpc.max_reconnect_backoff_ms", 2000),
            ]
        credentials = self._credentials.channel_credentials()
        if credentials is None:
            return module.insecure_channel(address, options=options)
        if self._targets.dns_name:
            # Dialled by the IP the SDK resolved; the certificate names the dns name.
            options.append(
                ("grpc.ssl_target_name_override", self._targets.dns_name.rpartition(":")[0])
            )
        return module.secure_channel(address, credentials, options=options)

    @staticmethod
    def _channel_options() -> list[tuple[str, Any]]:
        """Options for the gRPC channel (same for the sync and the async one)."""
        return [("grpc.max_receive_message_length", MAX_RECEIVE_MESSAGE_BYTES)]

    # --- argument checks ---

    @staticmethod
    def _check_seconds(value: float | None, what: str, error: type[TooljailError]) -> float | None:
        """A duration in seconds: None, or a positive finite number.

        Raises:
            TypeError: When the value is not a number (bool is not a number here).
            TooljailError: Of class `error`, when the number is not positive and finite.
        """
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{what} must be a number of seconds or None, got {value!r}")
        if not math.isfinite(value) or value <= 0:
            raise error(f"{what} must be a positive number of seconds, got {value!r}")
        return float(value)

    @staticmethod
    def _check_tool(tool: str) -> str:
        if not isinstance(tool, str):
            raise TypeError(f"tool must be a str (the tool's name), got {type(tool).__name__}")
        if not tool:
            raise InvalidRequestError("tool name is empty")
        return tool

    @staticmethod
    def _check_call_id(call_id: str | None, *, required: bool) -> str:
        """A call id as sent on the wire ("" asks the daemon to generate one).

        Raises:
            TypeError: When the id is not a string (or None where allowed).
            InvalidRequestError: When the id is empty (or None where required).
        """
        if call_id is None and not required:
            return ""
        if not isinstance(call_id, str):
            raise TypeError(f"call_id must be a str, got {type(call_id).__name__}")
        if not call_id:
            # "" on the wire means "generate one": an explicit empty id is a bug.
            raise InvalidRequestError("call_id is empty")
        return call_id

    @staticmethod
    def _encode_args(args: dict[str, Any] | None) -> str:
        """The arguments as the JSON object text of `CallRequest.arguments_json`.

        Raises:
            TypeError: When `args` is not a dict with str keys (or None for {}).
            InvalidRequestError: When a value cannot be written as JSON.
        """
        if args is None:
            return "{}"
        if not isinstance(args, dict):
            raise TypeError(
                f"args must be a dict of argument name to value, got {type(args).__name__}"
            )
        for key in args:
            if not isinstance(key, str):
                raise TypeError(f"argument names must be str, got {key!r}")
        try:
            return json.dumps(args, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise InvalidRequestError(f"args cannot be sent as JSON: {e}") from e

    def _build_call_request(
        self,
        tool: str,
        args: dict[str, Any] | None,
        *,
        tool_timeout_s: float | None,
        call_id: str | None,
        session_id: str | None = None,
        timeout: float | None = None,
        egress: Sequence[str] | None = None,
        secrets: Sequence[str] | None = None,
    ) -> pb.CallRequest:
        """The `CallRequest` for a call, after checking every argument.

        `timeout` is `tool_timeout_s`'s old name (a DeprecationWarning).
        `egress` and `secrets` travel as given (the daemon parses the rules and
        judges them against the caller's allowance); None sends none.

        Raises:
            TypeError: When an argument has the wrong type, or both
                `tool_timeout_s` and `timeout` are given.
            InvalidRequestError: When the tool name, call id or session id is
                empty, the arguments are not JSON-serialisable, or an egress
                rule or secret name is empty.
            BadTimeoutError: When the timeout is not a positive finite number.
        """
        tool_timeout_s = renamed_keyword("timeout", "tool_timeout_s", tool_timeout_s, timeout)
        checked_timeout = self._check_seconds(tool_timeout_s, "tool_timeout_s", BadTimeoutError)
        return pb.CallRequest(
            tool=self._check_tool(tool),
            arguments_json=self._encode_args(args),
            call_id=self._check_call_id(call_id, required=False) or self._new_call_id(),
            # 0 on the wire means "the tool's default timeout".
            timeout_s=checked_timeout or 0.0,
            # "" on the wire means "a fresh sandbox, no session".
            session_id="" if session_id is None else check_session_id(session_id),
            egress=check_names(egress, "egress"),
            secrets=check_names(secrets, "secrets"),
        )

    def _build_attach_request(self, call_id: str, from_seq: int) -> pb.AttachRequest:
        """The `AttachRequest` for `attach`, after checking its arguments.

        Raises:
            TypeError: When an argument has the wrong type.
            InvalidRequestError: When the id is empty or `from_seq` is negative.
        """
        return pb.AttachRequest(
            call_id=self._check_call_id(call_id, required=True),
            from_seq=self._check_seq(from_seq),
        )

    # --- decoding ---

    _protocol_error = staticmethod(protocol_error)
    _decode_event = staticmethod(decode_event)
    _decode_result = staticmethod(decode_result)
    _no_result_error = staticmethod(no_result_error)

    @classmethod
    def _decode_tools(cls, resp: pb.ListToolsResponse) -> list[ToolInfo]:
        try:
            return [tool_info_from_proto(t) for t in resp.tools]
        except ValueError as e:
            raise cls._protocol_error(e) from e

    @classmethod
    def _decode_diagnostics(cls, resp: pb.ListToolsResponse) -> list[Diagnostic]:
        try:
            return [diagnostic_from_proto(d) for d in resp.diagnostics]
        except ValueError as e:
            raise cls._protocol_error(e) from e

    def _build_approve_request(self, call_id: str, approve: bool, reason: str) -> pb.ApproveRequest:
        if not isinstance(reason, str):
            raise TypeError(f"reason must be a str, got {type(reason).__name__}")
        return pb.ApproveRequest(
            call_id=self._check_call_id(call_id, required=True), approve=approve, reason=reason
        )

    @classmethod
    def _decode_call_info(cls, m: pb.CallInfo) -> CallInfo:
        try:
            return call_info_from_proto(m)
        except ValueError as e:
            raise cls._protocol_error(e) from e

    @classmethod
    def _decode_cancel(cls, m: pb.CancelResponse) -> CallState:
        try:
            return call_state_from_proto(m.state)
        except ValueError as e:
            raise cls._protocol_error(e) from e

    # --- errors ---

    def _map_rpc_error(self, e: grpc.RpcError) -> TooljailError:
        """Our exception for a failed RPC (`ClientLink.map_error`)."""
        return self._link.map_error(e)

    @staticmethod
    def _openai_tools(tools: list[ToolInfo]) -> list[dict[str, Any]]:
        return [t.openai_schema() for t in tools]
