"""The demo application: a real traced training job (``examples/demo_job.py``) started on one
process per rank (``launch``), then analyzed and reported (``run``)."""
