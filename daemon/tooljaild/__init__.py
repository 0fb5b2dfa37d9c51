"""tooljaild: the daemon that runs AI agents' tool calls in sandboxes."""
