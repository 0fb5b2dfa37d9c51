"""The daemon's tools inside agent frameworks, and over MCP.

One module per framework; each is imported only when asked for, and the
framework it serves is an optional extra, never a dependency of the SDK:

    from tooljail import Client
    from tooljail.integrations import langchain  # needs `pip install 'tooljail[langchain]'`

    with Client() as client:
        tools = langchain.tools(client)

| module | factory | extra |
|---|---|---|
| `tooljail.integrations.lightagent` | `tools(target)` | `lightagent` |
| `tooljail.integrations.omnicore` | `registry(target)` | `omnicore` (Python >= 3.12) |
| `tooljail.integrations.pyagenity` | `tools(target)` | `pyagenity` |
| `tooljail.integrations.light_agents` | `tools(target)` | `light-agents` |
| `tooljail.integrations.langchain` | `tools(target)` | `langchain` |
| `tooljail.integrations.openai` | `tools`, `dispatch`, `anthropic_tools` | none |
| `tooljail.integrations.latent` | `tools(target)` | none |
| `tooljail.integrations.mcp_server` | `tooljail mcp` | `mcp` |

A target is a `Client`, an `AsyncClient`, a `Session` or an `AsyncSession`;
with a session, every tool runs in its interpreter and workspace. What every
adapter shares (tool specs, the `timeout_s` argument, the text a model reads on
success and failure) is in `tooljail.integrations.core`. docs/integrations/
has a page per framework.
"""
