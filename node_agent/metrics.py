"""The agent's own /metrics: per-GPU gauges computed from its state when scraped."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from analysim.ops_http import add_standard_metrics
from node_agent.agent import Agent

GPU_LABELS = ["node", "gpu", "gpu_model"]


class AgentCollector(Collector):
    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator:
        a = self.agent
        t = a.clock.now()
        util = GaugeMetricFamily("analysim_gpu_utilization_ratio", "GPU utilization (0..1).", labels=GPU_LABELS)
        mem = GaugeMetricFamily("analysim_gpu_memory_used_bytes", "GPU memory in use.", labels=GPU_LABELS)
        tot = GaugeMetricFamily("analysim_gpu_memory_total_bytes", "GPU memory on the board.", labels=GPU_LABELS)
        power = GaugeMetricFamily("analysim_gpu_power_watts", "GPU board power draw.", labels=GPU_LABELS)
        temp = GaugeMetricFamily("analysim_gpu_temperature_celsius", "GPU temperature.", labels=GPU_LABELS)
        healthy = GaugeMetricFamily("analysim_gpu_healthy", "1 when the GPU is healthy.", labels=GPU_LABELS)
        alloc = GaugeMetricFamily("analysim_gpu_allocated_ratio", "Share of the GPU held by jobs (0..1).",
                                  labels=GPU_LABELS)
        for n in a.nodes:
            for g in a.gpu_states(n, t):
                lab = [n.name, str(g.index), n.gpu_model]
                util.add_metric(lab, g.utilization)
                mem.add_metric(lab, g.memory_used_bytes)
                tot.add_metric(lab, g.memory_total_bytes)
                power.add_metric(lab, g.power_watts)
                temp.add_metric(lab, g.temperature_celsius)
                healthy.add_metric(lab, 1.0)
                alloc.add_metric(lab, min(a.used[n.name][g.index], 1000) / 1000)
        yield from (util, mem, tot, power, temp, healthy, alloc)
        yield GaugeMetricFamily("analysim_agent_virtual_time_seconds", "The agent's virtual clock.", value=t)
        yield GaugeMetricFamily("analysim_agent_running_jobs", "Jobs running on this agent's nodes.", value=len(a.jobs))
        yield GaugeMetricFamily("analysim_agent_connected", "1 while the stream to the scheduler is open.",
                                value=1.0 if a.connected else 0.0)
        msgs = CounterMetricFamily("analysim_agent_stream_messages", "Stream messages, by direction.",
                                   labels=["direction"])
        msgs.add_metric(["sent"], a.sent)
        msgs.add_metric(["received"], a.received)
        yield msgs
        yield CounterMetricFamily("analysim_agent_jobs_finished", "Completions reported.", value=a.completed)


def registry_for(agent: Agent) -> CollectorRegistry:
    r = CollectorRegistry(auto_describe=False)
    r.register(AgentCollector(agent))
    add_standard_metrics(r, "agent")
    return r
