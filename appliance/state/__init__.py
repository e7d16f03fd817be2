"""Replicated state: one log, one writer (the holder of the rack's lease), committed tables
and a changefeed for plugins (docs/state.md)."""
