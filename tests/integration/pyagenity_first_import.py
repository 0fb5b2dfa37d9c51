"""Uses the adapter as issue 21's user did: the adapter first, nothing of pyagenity's before.

    python pyagenity_first_import.py <target>

Run by tests/integration/test_integration_pyagenity.py in the pyagenity venv
(tests/py312.py). It prints, as JSON, what pyagenity had imported before the
adapter (nothing, or the check proves nothing), the tools' names, and what one
of them, called as ToolNode calls it, returned. On pyagenity 0.3.9 the adapter
used to say pyagenity "is not installed" here (issue 21).
"""

from __future__ import annotations

import json
import sys
from typing import Any


def main(target: str) -> dict[str, Any]:
    before = sorted(m for m in sys.modules if m == "pyagenity" or m.startswith("pyagenity."))
    # What the user wrote (tooljail imports nothing of pyagenity's): imported
    # here, not at the top, so `before` sees the interpreter as it was.
    from tooljail import Client
    from tooljail.integrations import pyagenity

    with Client(target) as client:
        functions = pyagenity.tools(client)
        by_name = {f.__name__: f for f in functions}
        message = by_name["execute_python_code"](code="print(6 * 7)", tool_call_id="call_1")
    # The ToolNode users build from them (imported after, as a user's graph code would).
    from pyagenity.graph import ToolNode

    node = ToolNode(functions)
    return {
        "before": before,
        "names": sorted(by_name),
        "message": message.model_dump(mode="json"),
        "toolnode_tools": sorted(t["function"]["name"] for t in node.get_local_tool()),
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
