"""Plain data: every config table as pydantic models; no I/O library, no live object."""
