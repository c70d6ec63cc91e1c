"""What travels between a training process and the collector: op batches as Arrow IPC (``batch``)
and the small HTTP client that posts them (``client``). The tracer's only way up to the monitor."""
