"""The node agent's GPU series under NVIDIA dcgm-exporter's names: an agent with a job running on
some of its GPUs, scraped over HTTP (its real /metrics server on 127.0.0.1) and read with
prometheus_client's own text parser. Each DCGM_FI_DEV_* family of dcgm-exporter's default
counters that the agent exports is a gauge with dcgm-exporter's help text, one series per GPU with
its label set (gpu, UUID, pci_bus_id, device, modelName, Hostname, and container/namespace/pod of
the workload), in its units (%, MiB, MHz, W, C), and agrees with our analysim_gpu_* series of the
same scrape; the running job is the pod on exactly its GPUs."""

from __future__ import annotations

import asyncio
import re
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from analysim._protos.v1 import agent_pb2 as apb
from analysim.clusters import parse_cluster
from analysim.ops_http import start_ops_server
from node_agent.agent import Agent
from node_agent.metrics import DCGM_GAUGES, registry_for

# dcgm-exporter's default-counters.csv (the gauges; its counters are left out, see
# node_agent/metrics.py) and the labels it puts on a GPU held by a Kubernetes pod.
DEFAULT_GAUGES = {
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
}
LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "container", "namespace", "pod"}
MIB = 2**20


def scrape(agent: Agent, namespace: str) -> dict:
    async def run() -> str:
        runner, port = await start_ops_server(registry_for(agent, namespace), "127.0.0.1", 0)
        try:
            return await asyncio.to_thread(
                lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode())
        finally:
            await runner.cleanup()

    return {f.name: f for f in text_string_to_metric_families(asyncio.run(run()))}


def test_dcgm_exporter_series_beside_ours() -> None:
    cluster = parse_cluster("2x8:A100")
    agent = Agent("agent-0", list(cluster.nodes))
    # A job on GPUs 2 and 3 of the first node, paced so that it runs while we scrape.
    agent.handle(apb.ConnectResponse(clock=apb.ClockUpdate(time_s=0.0, lockstep=True, step=1)))
    agent.handle(apb.ConnectResponse(commands=[apb.Command(time_s=0.0, launch=apb.Launch(
        job_id="job-7", launch_id=1, remaining_s=1e6, slowdown=1.0, duration_s=1e6,
        slots=[apb.GpuSlots(node="node-0000", gpus=[2, 3])]))]))
    families = scrape(agent, "demo")

    dcgm = {n for n in families if n.startswith("DCGM_")}
    assert dcgm == DEFAULT_GAUGES == set(DCGM_GAUGES)
    gpus = [(n.name, g) for n in cluster.nodes for g in range(n.gpus)]
    ours = {(s.labels["node"], int(s.labels["gpu"])): s.value
            for s in families["analysim_gpu_utilization_ratio"].samples}
    mem_used = {(s.labels["node"], int(s.labels["gpu"])): s.value
                for s in families["analysim_gpu_memory_used_bytes"].samples}
    power = {(s.labels["node"], int(s.labels["gpu"])): s.value for s in families["analysim_gpu_power_watts"].samples}
    for name in sorted(dcgm):
        f = families[name]
        assert f.type == "gauge" and f.documentation == DCGM_GAUGES[name], name
        by_gpu = {}
        for s in f.samples:
            assert s.name == name and set(s.labels) == LABELS, (name, s.labels)
            by_gpu[(s.labels["Hostname"], int(s.labels["gpu"]))] = s
        assert sorted(by_gpu) == sorted(gpus), name
        for (node, g), s in by_gpu.items():
            lab = s.labels
            assert lab["device"] == f"nvidia{g}" and lab["modelName"] == "NVIDIA A100-SXM4-80GB"
            assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", lab["UUID"])
            assert re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]", lab["pci_bus_id"])
            busy = (node, g) in {("node-0000", 2), ("node-0000", 3)}
            want = ("job", "demo", "job-7") if busy else ("", "", "")
            assert (lab["container"], lab["namespace"], lab["pod"]) == want, (name, node, g)
    # Every GPU is one board: distinct UUIDs, stable across scrapes.
    uuids = [s.labels["UUID"] for s in families["DCGM_FI_DEV_GPU_UTIL"].samples]
    assert len(set(uuids)) == len(gpus)
    assert uuids == [s.labels["UUID"] for s in scrape(agent, "demo")["DCGM_FI_DEV_GPU_UTIL"].samples]

    # Units: percent, MiB, W; the same sample as our series.
    def value(name: str, node: str, g: int) -> float:
        return next(s.value for s in families[name].samples
                    if s.labels["Hostname"] == node and s.labels["gpu"] == str(g))

    for node, g in gpus:
        util = value("DCGM_FI_DEV_GPU_UTIL", node, g)
        assert util == round(100 * ours[(node, g)]) and 0 <= util <= 100
        used, free = value("DCGM_FI_DEV_FB_USED", node, g), value("DCGM_FI_DEV_FB_FREE", node, g)
        assert used == int(mem_used[(node, g)]) // MIB and used + free in (80 * 1024, 80 * 1024 - 1)
        assert value("DCGM_FI_DEV_POWER_USAGE", node, g) == power[(node, g)]
        assert 20 <= value("DCGM_FI_DEV_GPU_TEMP", node, g) <= 95
    assert value("DCGM_FI_DEV_GPU_UTIL", "node-0000", 2) >= 50 and value("DCGM_FI_DEV_GPU_UTIL", "node-0001", 0) == 0
    assert value("DCGM_FI_DEV_SM_CLOCK", "node-0000", 2) == 1410 > value("DCGM_FI_DEV_SM_CLOCK", "node-0001", 0)
    assert value("DCGM_FI_DEV_FB_USED", "node-0000", 2) > value("DCGM_FI_DEV_FB_USED", "node-0001", 0)
