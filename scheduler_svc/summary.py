"""The run summary of a live replay: the same keys as ``analysim simulate``'s summary.json, plus
``live`` (speedup, messages, decision latency, resources) and ``fidelity`` (against an offline
run of the same inputs)."""

from __future__ import annotations

import resource
import time

import numpy as np

from scheduler_svc.read_model import LiveView


def build_summary(live: LiveView) -> dict:
    summary = dict(live.header)
    summary.update(live.recorder.summary(live.engine))
    n_client = live.client_jobs()
    summary["jobs_total"] = live.trace_total + n_client
    summary["jobs_client"] = n_client
    if live.trace_skipped:
        summary["jobs_filtered"] = {**summary["jobs_filtered"], "duplicate_id": live.trace_skipped}
    wall = (live.wall_done or time.monotonic()) - (live.wall_start or time.monotonic())
    summary["wall_s"] = wall
    summary["trace"] = live.trace_source
    lat = live.latencies
    ru = resource.getrusage(resource.RUSAGE_SELF)
    registry = live.registry
    sent = registry.get_sample_value("analysim_stream_messages_total", {"direction": "sent"}) or 0.0
    received = registry.get_sample_value("analysim_stream_messages_total", {"direction": "received"}) or 0.0
    summary["live"] = {
        "mode": "lockstep" if live.clock.lockstep else "paced",
        "speed": None if live.clock.lockstep else live.clock.speed,
        "speedup": live.achieved_speed(),
        "virtual_s": live.engine.now - live.virtual_start,
        "steps": live.steps,
        "messages_sent": sent,
        "messages_received": received,
        "messages_per_s": (sent + received) / wall if wall > 0 else 0.0,
        "decision_latency_p50_s": lat.quantile(0.5),
        "decision_latency_p99_s": lat.quantile(0.99),
        "decision_latency_max_s": lat.max,
        "agents_lost": live.agents_lost,
        # Lockstep: {"at_s", "why"} once an agent was lost (the schedule is not the offline run's from then on).
        "diverged_from_offline": live.diverged,
        "jobs_resumed": live.jobs_resumed,
        "scheduler_cpu_s": ru.ru_utime + ru.ru_stime,
        "scheduler_peak_rss_bytes": ru.ru_maxrss * 1024,
    }
    return summary


def fidelity(live: LiveView) -> dict:
    """The offline run of the same inputs, and how far this run's per-job times are from it."""
    from analysim.simulation import run

    ref = run(live.offline_input, live.cluster, live.opts, trace_filtered=live.trace_filtered)
    offline = {j["job_id"]: j for j in ref.jobs}
    rows = {j["job_id"]: j for j in live.recorder.jobs}
    deltas, same = [], 0
    for job_id, o in offline.items():
        j = rows.get(job_id)
        if j is None or o["status"] != "completed" or j.get("status") != "completed":
            continue
        d = abs(j["jct_s"] - o["jct_s"])
        deltas.append(d)
        if j["first_start_s"] == o["first_start_s"] and j["end_s"] == o["end_s"]:
            same += 1
    mean_jct = ref.summary.get("avg_jct_s") or 0.0
    arr = np.array(deltas) if deltas else np.zeros(1)
    return {
        "compared_jobs": len(deltas),
        "identical_jobs": same,
        "mean_abs_delta_jct_s": float(arr.mean()),
        "max_abs_delta_jct_s": float(arr.max()),
        "offline_avg_jct_s": mean_jct,
        "divergence_ratio": float(arr.mean()) / mean_jct if mean_jct else 0.0,
    }
