"""Sessions: a sandbox kept for a sequence of calls, with a live interpreter and a
workspace (`session`), and the daemon's set of them (`manager`). The `[sessions]`
settings are in `settings`, which the config imports (so this package imports
nothing at its top).
"""
