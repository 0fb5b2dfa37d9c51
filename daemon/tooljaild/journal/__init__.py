"""The journal: every call's id, tool, arguments, state and result in SQLite (WAL)."""
