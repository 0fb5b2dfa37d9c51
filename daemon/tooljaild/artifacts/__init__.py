"""Artifacts: what calls make (whole outputs, offloaded results, files, figures),
kept for their client in the daemon's state directory (`store`, over its SQLite
`index`, its `files`, its bounds `quotas` and its `writer`), bounded by
`[artifacts]` (`tooljaild.settings.artifacts`): this package imports nothing at its top."""
