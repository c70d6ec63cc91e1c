"""Reports: terminal summary (rich), JSON, self-contained HTML."""
