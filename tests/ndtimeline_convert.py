"""Write a synthetic (native) job as an NDTimeline trace, recorded the way Megatron's NDTimeline does.

Columns ``dp_rank, stage, rank, step, optype, start_ts, duration, seq_id, mc, gmc, mb_id`` with
times relative to each step's first op; p2p ops carry no chunk or microbatch (``-1``), as in the
published traces. Megatron's interleaved schedule issues a p2p call for every compute, also at
the ends of the virtual pipeline where nothing is transferred (the first forward recv and the
last forward send of a stage are the exceptions): those calls are recorded as zero-length ops
just before (recv) or after (send) their compute, and the importer must recognise them as
transferring nothing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from laggard.optable.ops import Job


def to_ndtimeline(job: Job, out_dir: Path, name: str = "SYN") -> Path:
    cols = ["dp_rank", "pp_rank", "rank", "step", "name", "start_ns", "dur_ns", "vchunk", "microbatch"]
    t = job.table.select(cols).to_pandas()
    t["name"] = t["name"].astype(str)
    t = t.rename(columns={"pp_rank": "stage", "name": "optype", "vchunk": "mc", "microbatch": "mb_id"})
    num_pp, vpp = job.meta.pp_size, job.meta.vpp_size
    if vpp > 1:
        t = pd.concat([t, _virtual_ends(t, num_pp, vpp)], ignore_index=True)
    t["step0"] = t.groupby("step")["start_ns"].transform("min")
    t["start_ts"] = (t["start_ns"] - t["step0"]) * 1e-9
    t["duration"] = t["dur_ns"] * 1e-9
    t = t.sort_values(["step", "dp_rank", "stage", "start_ns", "dur_ns"], kind="stable")
    t["seq_id"] = t.groupby(["step", "dp_rank", "stage", "optype"]).cumcount()
    p2p = t["optype"].str.contains("send|recv")
    comp = t["optype"].str.endswith("-compute")
    t.loc[p2p, ["mc", "mb_id"]] = -1
    t.loc[~comp & ~t["optype"].isin(["params-all-gather", "grads-reduce-scatter"]), "mc"] = -1
    t["gmc"] = np.where(comp, t["mc"] * num_pp + t["stage"], -1)
    out = t[["dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration", "seq_id", "mc", "gmc", "mb_id"]]
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"trace-{name}.parquet"
    pq.write_table(pa.Table.from_pandas(out.reset_index(drop=True), preserve_index=False), path)
    m = job.meta
    meta = {"trial_name": name, "dp_size": m.dp_size, "pp_size": num_pp, "tp_size": m.tp_size, "vpp_size": vpp,
            "world_size": m.num_gpus}
    (out_dir / f"meta-{name}.yaml").write_text(yaml.safe_dump(meta))
    return path


def _virtual_ends(t: pd.DataFrame, num_pp: int, vpp: int) -> pd.DataFrame:
    """Zero-length p2p calls Megatron records where the virtual pipeline has no neighbour."""
    rows = []
    num_v = num_pp * vpp
    for (_, _, s), g in t[t["name"].str.endswith("-compute") if "name" in t
                          else t["optype"].str.endswith("-compute")].groupby(["step", "dp_rank", "stage"]):
        for direction in ("forward", "backward"):
            comps = g[g["optype"] == f"{direction}-compute"].sort_values("start_ns")
            for i, (_, c) in enumerate(comps.iterrows()):
                v = int(c["mc"]) * num_pp + s
                recv_none = v == 0 if direction == "forward" else v == num_v - 1
                send_none = v == num_v - 1 if direction == "forward" else v == 0
                base = {k: c[k] for k in ("dp_rank", "stage", "rank", "step")} | {"mc": -1, "mb_id": -1, "dur_ns": 0}
                if recv_none and i > 0:
                    rows.append(base | {"optype": f"{direction}-recv", "start_ns": int(c["start_ns"])})
                if send_none and i < len(comps) - 1:
                    rows.append(base | {"optype": f"{direction}-send", "start_ns": int(c["start_ns"] + c["dur_ns"])})
    return pd.DataFrame(rows)
