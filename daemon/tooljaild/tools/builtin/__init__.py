"""The built-in tools: code, workspace files, artifacts and uploads."""
