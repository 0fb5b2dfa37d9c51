"""Calls of tools: admission, life cycle, results.

- `call`: one call (`Call`): its state, the moments others wait for, why it was stopped.
- `admission`: slots, the queue bound, per-client shares, call ids.
- `intake`: a request (`CallRequest`) and the checks before its admission: policy,
  arguments, whose session and call id.
- `book`: the calls remembered, in memory (bounded) and in the journal.
- `terms`: what a call runs with (arguments, timeout, limits, the sandbox request).
- `results`: what every ending means, as a `ToolResult`.
- `manager`: `CallManager`, which admits, starts, sees through and remembers calls.
"""

from tooljaild.calls.call import Call, StopReason
from tooljaild.calls.manager import CallManager
from tooljaild.calls.results import NO_OUTPUT_MESSAGE

__all__ = ["NO_OUTPUT_MESSAGE", "Call", "CallManager", "StopReason"]
