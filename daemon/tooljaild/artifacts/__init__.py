"""Artifacts: what calls make (whole outputs, offloaded results, files, figures),
kept for their client in the daemon's state directory (`store`), bounded by
`[artifacts]` (`settings`, which the config imports: this package imports
nothing at its top)."""
