"""`netrun profile`: what is timed (targets) and how (timing: per-op markers, traces)."""
