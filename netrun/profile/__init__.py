"""`netrun profile`: what is timed (targets), how (timing: per-op markers) and the timeline
of the timed iterations (trace: Chrome Trace Event Format for Perfetto)."""
