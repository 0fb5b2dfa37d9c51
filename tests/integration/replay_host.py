"""An agent host that runs an OpenAI-style conversation's tool calls: the host the replay test
kills and starts again.

Run by tests/integration/test_replay.py as a subprocess:

    python replay_host.py <target> <client name> <conversation.json> [hold]

The conversation is a list of Chat Completions messages as a host keeps them;
for each assistant message's `tool_calls` the host dispatches every call with
`tooljail.integrations.openai.dispatch` (the model's `tool_call.id` goes with
it) and prints each tool message as one JSON line, flushed. With `hold` it then
waits to be killed (a host that died after it got its answer, before it saved
it). Last it prints {"done": true}.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from tooljail import Client
from tooljail.integrations import openai as tj


def main(target: str, client_name: str, conversation: Path, hold: bool) -> None:
    messages = json.loads(conversation.read_text())
    with Client(target, client_name=client_name) as client:
        for message in messages:
            for tool_call in message.get("tool_calls") or ():
                answer = tj.dispatch(client, tool_call)
                print(json.dumps(answer), flush=True)
                while hold:
                    time.sleep(1)  # the test kills us here
    print(json.dumps({"done": True}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4:] == ["hold"])
