"""The scheduler's Prometheus metrics. Counters and histograms are updated as decisions are
made; cluster gauges are computed from the engine when /metrics is scraped (cheap, and never
stale). Names: ``analysim_`` prefix, base units (seconds, bytes), ``_total`` for counters,
dimensions as labels."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from analysim.core.job import GPU_MILLI
from analysim.core.metrics import head_of_line_fragmentation
from analysim.core.run_view import RunView
from analysim.ops_http import add_standard_metrics
from scheduler_svc.grpc_metrics import GrpcServerMetrics
from scheduler_svc.kueue_metrics import KueueMetrics
from scheduler_svc.read_model import ClusterView

# Virtual seconds: a minute to four weeks (trace jobs run from seconds to weeks).
JOB_TIME_BUCKETS = (60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600, 86400, 3 * 86400, 7 * 86400, 28 * 86400)
# analysim_agents_refused_total's reasons.
AGENT_REFUSALS = ("lookahead_not_ahead", "impossible_end")
# analysim_jobs_rejected_total's reasons: a submission out of bounds, one the journal could not
# take, a duplicate id, and each reason a job is invalid here (InvalidJob: the live checks, the
# core's feasibility, a partition's LocalQueues and quotas).
SUBMISSION_REFUSALS = ("out_of_bounds", "disk_full", "io_error", "duplicate_id", "bad_id", "bad_duration",
                       "bad_submit", "bad_gpus", "unknown_vc", "unknown_gpu_model", "larger_than_vc_quota",
                       "no_matching_node", "larger_than_cluster", "no_local_queue", "resource_not_covered",
                       "larger_than_queue_quota")
# analysim_grpc_calls_refused_total's reasons.
CALL_REFUSALS = ("unauthenticated", "permission_denied", "foreign_node")
# analysim_agent_reports_ignored_total's reasons.
IGNORED_REPORTS = ("unknown_job", "stale_launch", "duplicate", "bad_time", "oversized_heartbeat", "unknown_node",
                   "impossible_gpu_state")
# Wall seconds: the target is p99 under 10 ms.
LATENCY_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 1.0)


class SchedulerMetrics:
    """The scheduler's counters and histograms (the gauges are collected at each scrape)."""

    def __init__(self) -> None:
        # the scheduler's own registry (what /metrics serves)
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # jobs accepted, by VC and source
        self.submitted = Counter("analysim_jobs_submitted_total", "Jobs accepted, by VC and source (trace|client).",
                                 ["vc", "source"], registry=r)
        # job launches, by VC
        self.started = Counter("analysim_jobs_started_total", "Job launches (first starts and restarts).", ["vc"], registry=r)
        # jobs completed, by VC
        self.completed = Counter("analysim_jobs_completed_total", "Jobs that completed.", ["vc"], registry=r)
        # preemptions, by VC
        self.preempted = Counter("analysim_jobs_preempted_total", "Preemptions (checkpointed).", ["vc"], registry=r)
        # migrations, by VC
        self.migrated = Counter("analysim_jobs_migrated_total", "Migrations.", ["vc"], registry=r)
        # jobs requeued by a node going down, by VC
        self.requeued = Counter("analysim_jobs_requeued_total", "Jobs requeued because a node went down.", ["vc"], registry=r)
        # jobs an agent reported failed, by VC
        self.failed = Counter("analysim_jobs_failed_total", "Jobs reported failed by an agent.", ["vc"], registry=r)
        # jobs a client cancelled, by VC
        self.cancelled = Counter("analysim_jobs_cancelled_total", "Jobs cancelled by a client.", ["vc"], registry=r)
        # submissions refused, by reason (SUBMISSION_REFUSALS)
        self.rejected = Counter("analysim_jobs_rejected_total", "Submissions refused, by reason.", ["reason"], registry=r)
        # calls refused before any service, by reason (CALL_REFUSALS)
        self.refused_calls = Counter("analysim_grpc_calls_refused_total",
                                     "Calls refused before reaching a service: unauthenticated, permission_denied, "
                                     "foreign_node (an agent token registering a node it was not given).",
                                     ["reason"], registry=r)
        # virtual seconds from submission to first start
        self.queueing = Histogram("analysim_job_queueing_delay_seconds",
                                  "Virtual seconds from submission to first start.", buckets=JOB_TIME_BUCKETS, registry=r)
        # virtual seconds from submission to completion
        self.jct = Histogram("analysim_job_completion_time_seconds",
                             "Virtual seconds from submission to completion.", buckets=JOB_TIME_BUCKETS, registry=r)
        # wall seconds from an event being due to its commands being sent
        self.latency = Histogram("analysim_scheduler_decision_latency_seconds",
                                 "Wall seconds from an event being due to the decisions being sent to the agents.",
                                 buckets=LATENCY_BUCKETS, registry=r)
        # agent stream messages, by direction
        self.messages = Counter("analysim_stream_messages_total", "Agent stream messages, by direction (sent|received).",
                                ["direction"], registry=r)
        # agent reports ignored, by reason (IGNORED_REPORTS)
        self.agent_events = Counter("analysim_agent_reports_ignored_total",
                                    "Agent reports ignored (unknown job, stale launch, impossible GPU state), by reason.",
                                    ["reason"], registry=r)
        # agent sessions lost
        self.agents_lost = Counter("analysim_agents_lost_total", "Agent sessions lost (stream ended or heartbeat missed).",
                                   registry=r)
        # agent sessions refused, by reason (AGENT_REFUSALS)
        self.agents_refused = Counter("analysim_agents_refused_total",
                                      "Agent sessions ended with INVALID_ARGUMENT for a report no honest agent sends, "
                                      "by reason (lookahead_not_ahead, impossible_end); each is also lost.",
                                      ["reason"], registry=r)
        # Every reason's series from the start, at 0: an alert on increase() sees the first one.
        for counter, reasons in ((self.agents_refused, AGENT_REFUSALS), (self.rejected, SUBMISSION_REFUSALS),
                                 (self.refused_calls, CALL_REFUSALS), (self.agent_events, IGNORED_REPORTS)):
            for reason in reasons:
                counter.labels(reason)
        self.grpc_server = GrpcServerMetrics(r)  # the gRPC server's interceptor
        add_standard_metrics(r, "scheduler")
        # messages{direction="sent"}
        self.sent = self.messages.labels("sent")
        # messages{direction="received"}
        self.received = self.messages.labels("received")
        # (id(counter), vc) -> counter.labels(vc): the hot path's cache
        self._vc_children: dict[tuple[int, str], object] = {}
        self.kueue: KueueMetrics | None = None  # Kueue's names too, under a partition

    def vc(self, counter: Counter, vc: str):
        """``counter.labels(vc)``, cached: labels() costs more than inc() on the hot path."""
        key = (id(counter), vc)
        child = self._vc_children.get(key)
        if child is None:
            child = self._vc_children[key] = counter.labels(vc)
        return child

    def attach(self, live: ClusterView) -> None:
        self.registry.register(_ClusterCollector(live))
        if live.cluster.partition is not None:
            self.kueue = KueueMetrics(self.registry, live)
        Gauge("analysim_journal_writable", "1 while the journal takes writes; 0 (disk full, I/O error): "
              "submissions are refused and the open group is kept and retried.",
              registry=self.registry).set_function(lambda: 0.0 if live.journal.failure else 1.0)
        # Every per-VC counter starts at 0 for every VC, so that a rate is 0 (not absent)
        # until the first event: dashboards and alerts then tell "none" from "no data".
        for v in live.known_vcs():
            for c in (self.started, self.completed, self.preempted, self.migrated, self.requeued, self.failed,
                      self.cancelled):
                self.vc(c, v)
            for source in ("trace", "client"):
                self.submitted.labels(v, source)


class _ClusterCollector(Collector):
    """The cluster's gauges, read from the run at each scrape."""

    def __init__(self, live: ClusterView) -> None:
        self.live = live  # the run's read model

    def describe(self) -> list:
        return []  # computed on scrape; nothing to check at registration

    def collect(self) -> Iterator[GaugeMetricFamily]:
        live = self.live
        yield from self._gpus(live)
        yield from self._quotas(live.engine)
        yield from self._pending(live)
        yield from self._fragmentation(live.engine)
        yield from self._nodes(live)
        yield from self._clock(live)
        yield from self._fidelity(live)

    @staticmethod
    def _gpus(live: ClusterView) -> Iterator[GaugeMetricFamily]:
        """Capacity, allocation (by VC) and free GPUs, by GPU model."""
        eng = live.engine
        st = eng.state
        models = st.model_names
        cap = GaugeMetricFamily("analysim_cluster_gpus", "GPUs on nodes that are up, by GPU model.", labels=["gpu_model"])
        alloc = GaugeMetricFamily("analysim_allocated_gpus", "GPUs held by running jobs, by VC and GPU model.",
                                  labels=["vc", "gpu_model"])
        free = GaugeMetricFamily("analysim_free_gpus", "Free GPUs on nodes that are up, by GPU model.", labels=["gpu_model"])
        # Every known VC on every model, at 0 when it holds none (trace VCs the run does not name too).
        by: dict[tuple[str, str], float] = {(vc, m): 0.0 for vc in live.known_vcs() for m in models}
        for job in eng.running.values():
            per = job.spec.gpu_milli / GPU_MILLI
            for n, slots in job.placement.gpus:
                key = (job.spec.vc, models[st.model_id[n]])
                by[key] = by.get(key, 0.0) + len(slots) * per
        for (vc, m), v in sorted(by.items()):
            alloc.add_metric([vc, m], v)
        for i, m in enumerate(models):
            mask = st.up & (st.model_id == i)
            total = float(st.gpus[mask].sum())
            cap.add_metric([m], total)
            f = st.free_milli[mask]
            free.add_metric([m], float(f[f > 0].sum()) / GPU_MILLI)
        yield cap
        yield alloc
        yield free

    @staticmethod
    def _quotas(eng: RunView) -> Iterator[GaugeMetricFamily]:
        quota = GaugeMetricFamily("analysim_vc_quota_gpus", "GPUs guaranteed to each VC.", labels=["vc"])
        vfree = GaugeMetricFamily("analysim_vc_free_quota_gpus", "Unused quota of each VC.", labels=["vc"])
        for v in eng.spec.vcs:
            q = eng.quota_of(v.name)
            if q is not None:
                quota.add_metric([v.name], q)
                vfree.add_metric([v.name], max(0.0, q - eng.state.vc_used.get(v.name, 0.0)))
        yield quota
        yield vfree

    @staticmethod
    def _pending(live: ClusterView) -> Iterator[GaugeMetricFamily]:
        pend = GaugeMetricFamily("analysim_pending_jobs", "Jobs waiting in the queue, by VC.", labels=["vc"])
        demand = GaugeMetricFamily("analysim_pending_gpus", "GPUs asked for by waiting jobs, by VC.", labels=["vc"])
        pj: dict[str, int] = defaultdict(int)
        pg: dict[str, float] = defaultdict(float)
        for job in live.engine.pending_jobs():
            pj[job.spec.vc] += 1
            pg[job.spec.vc] += job.spec.gpu_demand
        for vc in sorted(set(pj) | set(live.known_vcs())):  # every VC, 0 when none waits
            pend.add_metric([vc], pj[vc])
            demand.add_metric([vc], pg[vc])
        yield pend
        yield demand

    @staticmethod
    def _fragmentation(eng: RunView) -> Iterator[GaugeMetricFamily]:
        frag = head_of_line_fragmentation(eng)
        yield GaugeMetricFamily("analysim_fragmented_gpus",
                                "Free GPUs the head-of-line job cannot use (0 when nothing waits).", value=frag)
        yield GaugeMetricFamily("analysim_fragmentation_ratio", "Fragmented GPUs over cluster GPUs.",
                                value=frag / eng.spec.total_gpus if eng.spec.total_gpus else 0.0)
        yield GaugeMetricFamily("analysim_running_jobs", "Jobs running.", value=len(eng.running))

    @staticmethod
    def _nodes(live: ClusterView) -> Iterator[GaugeMetricFamily]:
        st = live.engine.state
        nodes = GaugeMetricFamily("analysim_nodes", "Nodes by state (up|down).", labels=["state"])
        up = int(st.up.sum()) if live.started else 0
        nodes.add_metric(["up"], up)
        nodes.add_metric(["down"], st.num_nodes - up)
        yield nodes
        yield GaugeMetricFamily("analysim_agents_connected", "Agent sessions with an open stream.",
                                value=live.agents_connected())

    @staticmethod
    def _clock(live: ClusterView) -> Iterator[GaugeMetricFamily]:
        clock = live.clock
        yield GaugeMetricFamily("analysim_virtual_time_seconds", "The virtual clock.", value=clock.now())
        yield GaugeMetricFamily("analysim_clock_speed_ratio",
                                "Virtual seconds per wall second: the set speed when paced, the achieved one in lockstep.",
                                value=live.achieved_speed() if clock.lockstep else clock.speed)
        yield GaugeMetricFamily("analysim_clock_lockstep", "1 in lockstep mode.", value=1.0 if clock.lockstep else 0.0)
        yield GaugeMetricFamily("analysim_clock_paused", "1 while the clock is paused.", value=1.0 if clock.paused else 0.0)
        yield GaugeMetricFamily("analysim_lockstep_diverged",
                                "1 once a lockstep replay lost an agent (its jobs requeued): from then on it is not the "
                                "offline run; when and why in the log and the summary's live.diverged_from_offline.",
                                value=0.0 if live.diverged is None else 1.0)

    @staticmethod
    def _fidelity(live: ClusterView) -> Iterator[GaugeMetricFamily]:
        fid = (live.summary or {}).get("fidelity")
        if fid:  # once the replay is done and compared with its offline run
            yield GaugeMetricFamily("analysim_offline_divergence_ratio",
                                    "Mean |JCT live - JCT offline| over the offline mean JCT, at the end of the replay.",
                                    value=fid["divergence_ratio"])
            yield GaugeMetricFamily("analysim_offline_identical_jobs_ratio",
                                    "Share of compared jobs with the same start and end live and offline.",
                                    value=fid["identical_jobs"] / fid["compared_jobs"] if fid["compared_jobs"] else 1.0)
