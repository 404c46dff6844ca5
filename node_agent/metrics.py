"""The agent's own /metrics: per-GPU gauges computed from its state when scraped, under our names
(analysim_gpu_*) and under NVIDIA dcgm-exporter's (DCGM_FI_DEV_*), so that dashboards and alerts
written for real GPU clusters work on the emulator."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from analysim.ops_http import add_standard_metrics
from node_agent.agent import Agent
from node_agent.telemetry import IDLE_SM_CLOCK_MHZ, GpuModel, gpu_uuid, pci_bus_id, spec

if TYPE_CHECKING:
    from analysim._protos.v1 import agent_pb2 as apb

GPU_LABELS = ["node", "gpu", "gpu_model"]
MIB = 1024**2

# dcgm-exporter's labels: the GPU's entity labels, then the workload's (its Kubernetes pod
# mapping). The emulated workload is the job: pod = the job id, namespace = the cluster, container
# = "job"; all three empty on an idle GPU (in Prometheus an empty label is no label, as on a real
# exporter, which adds them only to GPUs a pod holds).
DCGM_LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "container", "namespace", "pod"]
DCGM_CONTAINER = "job"

# The gauges of dcgm-exporter's default counters (etc/default-counters.csv), with its help texts.
# Left out: its counters (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, PCIe, NVLink, remapped rows), whose
# names lack the `_total` that prometheus_client's exposition adds to every counter, and
# DCGM_FI_DEV_VGPU_LICENSE_STATUS (no vGPU here).
DCGM_GAUGES = {
    "DCGM_FI_DEV_SM_CLOCK": "SM clock frequency (in MHz).",
    "DCGM_FI_DEV_MEM_CLOCK": "Memory clock frequency (in MHz).",
    "DCGM_FI_DEV_MEMORY_TEMP": "Memory temperature (in C).",
    "DCGM_FI_DEV_GPU_TEMP": "GPU temperature (in C).",
    "DCGM_FI_DEV_POWER_USAGE": "Power draw (in W).",
    "DCGM_FI_DEV_GPU_UTIL": "GPU utilization (in %).",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "Memory utilization (in %).",
    "DCGM_FI_DEV_ENC_UTIL": "Encoder utilization (in %).",
    "DCGM_FI_DEV_DEC_UTIL": "Decoder utilization (in %).",
    "DCGM_FI_DEV_XID_ERRORS": "Value of the last XID error encountered.",
    "DCGM_FI_DEV_FB_FREE": "Framebuffer memory free (in MiB).",
    "DCGM_FI_DEV_FB_USED": "Framebuffer memory used (in MiB).",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "Whether remapping of rows has failed",
}


class AgentCollector(Collector):
    def __init__(self, agent: Agent, namespace: str = "") -> None:
        self.agent = agent
        self.namespace = namespace  # the workload's namespace label of the DCGM series

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
        dcgm = {name: GaugeMetricFamily(name, doc, labels=DCGM_LABELS) for name, doc in DCGM_GAUGES.items()}
        for n in a.nodes:
            board = spec(n.gpu_model)
            for g in a.gpu_states(n, t):
                self._dcgm(dcgm, n.name, board, board.product or n.gpu_model, g)
                lab = [n.name, str(g.index), n.gpu_model]
                util.add_metric(lab, g.utilization)
                mem.add_metric(lab, g.memory_used_bytes)
                tot.add_metric(lab, g.memory_total_bytes)
                power.add_metric(lab, g.power_watts)
                temp.add_metric(lab, g.temperature_celsius)
                healthy.add_metric(lab, 1.0)
                alloc.add_metric(lab, min(a.used[n.name][g.index], 1000) / 1000)
        yield from (util, mem, tot, power, temp, healthy, alloc)
        yield from dcgm.values()
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


    def _dcgm(self, out: dict[str, GaugeMetricFamily], node: str, board: GpuModel, product: str,
              g: apb.GpuState) -> None:
        """One GPU's DCGM series, in dcgm-exporter's units (%, MiB, MHz, W, C): the same sample
        as our gauges, so the two never disagree."""
        workload = [DCGM_CONTAINER, self.namespace, g.job_id] if g.job_id else ["", "", ""]
        lab = [str(g.index), gpu_uuid(node, g.index), pci_bus_id(g.index), f"nvidia{g.index}", product, node,
               *workload]
        busy = g.utilization > 0
        values = {
            "DCGM_FI_DEV_SM_CLOCK": board.sm_clock_mhz if busy else IDLE_SM_CLOCK_MHZ,
            "DCGM_FI_DEV_MEM_CLOCK": board.mem_clock_mhz,
            # HBM sits beside the die, a few degrees warmer; GDDR boards report no memory temperature.
            "DCGM_FI_DEV_MEMORY_TEMP": round(g.temperature_celsius + 3) if board.hbm else 0,
            "DCGM_FI_DEV_GPU_TEMP": round(g.temperature_celsius),
            "DCGM_FI_DEV_POWER_USAGE": g.power_watts,
            "DCGM_FI_DEV_GPU_UTIL": round(100 * g.utilization),
            # Training keeps the memory bus about half as busy as the SMs.
            "DCGM_FI_DEV_MEM_COPY_UTIL": round(50 * g.utilization),
            "DCGM_FI_DEV_ENC_UTIL": 0,
            "DCGM_FI_DEV_DEC_UTIL": 0,
            "DCGM_FI_DEV_XID_ERRORS": 0,  # the emulated boards are healthy (analysim_gpu_healthy)
            "DCGM_FI_DEV_FB_FREE": int(g.memory_total_bytes - g.memory_used_bytes) // MIB,
            "DCGM_FI_DEV_FB_USED": int(g.memory_used_bytes) // MIB,
            "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0,
        }
        for name, v in values.items():
            out[name].add_metric(lab, v)


def registry_for(agent: Agent, namespace: str = "") -> CollectorRegistry:
    """The agent's registry; namespace is the DCGM series' workload namespace (the cluster's name)."""
    r = CollectorRegistry(auto_describe=False)
    r.register(AgentCollector(agent, namespace))
    add_standard_metrics(r, "agent")
    return r
