"""A traced loop streaming to a collector (run as a process by tests/test_monitor_stream.py).

    python tests/monitor_tracer_job.py URL TOKEN TRACE_DIR RANK WORLD STEPS [SLOW_FACTOR]
"""

import json
import sys
import time

from laggard.tracer import Tracer

url, token, out, rank, world, steps = sys.argv[1:7]
rank, world, steps = int(rank), int(world), int(steps)
slow = float(sys.argv[7]) if len(sys.argv) > 7 else 1.0
tracer = Tracer(out, rank=rank, world_size=world, dp_rank=rank, monitor_url=url, token=token, monitor_job="faultjob",
                flush_interval_s=0.05, handle_signals=False)
for s in range(steps):
    with tracer.step(s):
        for mb in range(4):
            with tracer.op("forward-compute", microbatch=mb):
                time.sleep(0.004 * slow)
            with tracer.op("backward-compute", microbatch=mb):
                time.sleep(0.006 * slow)
tracer.close()
st = tracer._stream
print(json.dumps({"recorded": tracer.num_ops_recorded, "sent": st.num_sent, "spooled": st.num_spooled,
                  "dropped": st.num_dropped, "left": len(st._spool_files)}))
