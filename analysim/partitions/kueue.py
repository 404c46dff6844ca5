"""Kueue's objects as a cluster's partition: a multi-document YAML of ResourceFlavor, ClusterQueue,
Cohort, LocalQueue and WorkloadPriorityClass (``kueue.x-k8s.io`` v1beta1 and v1beta2 field names;
Cohort also v1alpha1), read into analysim.core.partition's model.

Every field Kueue has is either modelled, accepted but not modelled (listed in docs/kueue.md, and
warned about once per kind and field), or an error: an unknown kind or field, a bad value or a
dangling reference is one line naming the file, the line, the document and the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal, DecimalException
from pathlib import Path
from typing import Any

import yaml

from analysim.core.cluster import ClusterSpec
from analysim.core.partition import (
    BEST_EFFORT_FIFO,
    BORROW_WITHIN_COHORT,
    BORROWING_OVER_PREEMPTION,
    CPU,
    FAIR_STRATEGIES,
    GPU,
    MEMORY,
    NEVER,
    PER_REPORTED_UNIT,
    PREEMPTION_OVER_BORROWING,
    RECLAIM_WITHIN_COHORT,
    STRICT_FIFO,
    WITHIN_CLUSTER_QUEUE,
    FairSharing,
    Flavor,
    Partition,
    PartitionNode,
    Preemption,
    Quota,
    QuotaTree,
    ResourceGroup,
)
from analysim.errors import InputFileError, UserError, read_text

GROUP = "kueue.x-k8s.io"
VERSIONS = {
    "ResourceFlavor": ("v1beta1", "v1beta2"),
    "ClusterQueue": ("v1beta1", "v1beta2"),
    "LocalQueue": ("v1beta1", "v1beta2"),
    "WorkloadPriorityClass": ("v1beta1", "v1beta2"),
    "Cohort": ("v1alpha1", "v1beta1", "v1beta2"),
}
# Kueue's own Configuration (the controller's config file), read for its fairSharing.
CONFIG_GROUP = "config.kueue.x-k8s.io"
CONFIG_VERSIONS = ("v1beta1", "v1beta2")
# Configuration fields that change nothing a replay models (accepted, warned about once).
_CONFIG_UNMODELLED = ("namespace", "manageJobsWithoutQueueName", "managedJobsNamespaceSelector", "waitForPodsReady",
                      "integrations", "resources", "admissionFairSharing", "featureGates", "internalCertManagement",
                      "controller", "health", "metrics", "webhook", "leaderElection", "clientConnection",
                      "multiKueue", "objectRetentionPolicies", "queueVisibility")
# metadata fields: name and namespace are read; the rest are what the API server and kubectl add
# (`kubectl get -o yaml`), and change nothing Kueue does: ignored without a warning, as is every
# object's ``status`` (the server's record of the object, not its configuration).
_METADATA = ("name", "namespace", "labels", "annotations", "uid", "resourceVersion", "generation",
             "creationTimestamp", "managedFields", "finalizers", "ownerReferences", "deletionTimestamp",
             "deletionGracePeriodSeconds", "generateName", "selfLink")
_READ_METADATA = ("name", "namespace")
# What `kubectl get KINDS -o yaml|json` wraps several objects in.
LIST_API, LIST_KIND = "v1", "List"
# A Workload is a job's record, not a partition's object: its list is read as a trace.
_TRACE_KINDS = {"Workload": "kueue-workloads"}
# Resources the cluster model has; others (pods, ephemeral-storage, extended resources) are
# accepted in quotas and warned about: no job of a trace asks for them.
MODELLED_RESOURCES = (GPU, CPU, MEMORY)
# Kubernetes quantity suffixes.
_SUFFIX = {"": 1, "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "k": 10**3, "M": 10**6,
           "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30,
           "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_QUANTITY = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]?)")
# Base units per resource (analysim.core.partition.UNITS): GPUs in thousandths, CPU in
# millicores, memory and anything else in the quantity's own unit.
# A fairSharing weight is read as a quantity too, in thousandths (a weight may be 0.5).
WEIGHT = "fairSharing.weight"
_SCALE = {**PER_REPORTED_UNIT, WEIGHT: 1000}
# The most a quota may give, in base units: far beyond any cluster (a million GPUs, 100 million
# cores, an exbibyte of memory), and small enough to stay exact as a float in the core's sums.
_MOST = {GPU: 10**9, CPU: 10**11, MEMORY: 2**60, WEIGHT: 10**9}
_MOST_OTHER = 2**53
# A partition file is a cluster's configuration, a few KB: past these it is refused before it is
# parsed (or while it is), rather than read for minutes.
MAX_FILE_BYTES = 4 << 20
MAX_DOCUMENTS = 5000


@dataclass
class _Read:
    path: str
    cluster: ClusterSpec
    warned: dict[tuple[str, str], int] = field(default_factory=dict)  # (kind, field) -> first line
    flavors: dict[str, tuple[Flavor, int]] = field(default_factory=dict)
    cqs: dict[str, tuple[PartitionNode, int, str]] = field(default_factory=dict)  # name -> (node, line, cohort ref)
    cohorts: dict[str, tuple[PartitionNode, int]] = field(default_factory=dict)
    # (namespace, LocalQueue name) -> (ClusterQueue, line); namespace "" when it has none
    local: dict[tuple[str, str], tuple[str, int]] = field(default_factory=dict)
    priorities: dict[str, int] = field(default_factory=dict)
    fair_sharing: FairSharing | None = None
    configured: bool = False  # a Configuration document was read
    # What turns a scalar node into its value (int, float, str, ...), as a YAML loader would: one
    # per file, not a loader per value (a partition of a thousand ClusterQueues has 15,000 values)
    scalars: yaml.constructor.SafeConstructor = field(default_factory=yaml.constructor.SafeConstructor)

    def warn(self, kind: str, path: str, line: int) -> None:
        """A field accepted but not modelled: warned about once per kind and field."""
        self.warned.setdefault((kind, path), line)


class _At:
    """A YAML node with where it is: the file, document, object and field path, for errors."""

    def __init__(self, read: _Read, node: yaml.Node, doc: int, what: str, path: str) -> None:
        self.read, self.node, self.doc, self.what, self.path = read, node, doc, what, path

    @property
    def line(self) -> int:
        return self.node.start_mark.line + 1

    def error(self, problem: str) -> InputFileError:
        where = f"document {self.doc}" + (f" ({self.what})" if self.what else "")
        return InputFileError(self.read.path, self.line, None,
                              f"{where}: {self.path + ': ' if self.path else ''}{problem}")

    def child(self, node: yaml.Node, step: str) -> _At:
        path = f"{self.path}.{step}" if self.path and not step.startswith("[") else self.path + step
        return _At(self.read, node, self.doc, self.what, path)

    def fields(self, known: tuple[str, ...], unmodelled: tuple[str, ...] = (),
               ignored: tuple[str, ...] = ()) -> dict[str, _At]:
        """A mapping's fields: an unknown one is an error; an unmodelled one is warned about; an
        ignored one (the server's, not the user's) is taken silently."""
        if not isinstance(self.node, yaml.MappingNode):
            raise self.error(f"expected a mapping, got {_kind(self.node)}")
        out: dict[str, _At] = {}
        for k, v in self.node.value:
            name = k.value if isinstance(k, yaml.ScalarNode) else str(k)
            at = self.child(v, name)
            if name in out:
                raise at.error("given twice")
            if name not in known and name not in unmodelled and name not in ignored:
                allowed = ", ".join(known + unmodelled)
                raise _At(self.read, k, self.doc, self.what, at.path).error(f"unknown field; known: {allowed}")
            if name in unmodelled:
                self.read.warn(self.what.split(" ")[0], at.path, at.line)
            out[name] = at
        return out

    def items(self) -> list[_At]:
        if not isinstance(self.node, yaml.SequenceNode):
            raise self.error(f"expected a list, got {_kind(self.node)}")
        return [self.child(v, f"[{i}]") for i, v in enumerate(self.node.value)]

    def value(self) -> Any:
        if not isinstance(self.node, yaml.ScalarNode):
            raise self.error(f"expected a value, got {_kind(self.node)}")
        scalars = self.read.scalars
        try:
            return scalars.construct_object(self.node)  # type: ignore[no-untyped-call]
        except yaml.YAMLError as e:  # a tag it does not know (!foo), a malformed timestamp, ...
            raise self.error(str(getattr(e, "problem", None) or e).splitlines()[0]) from None
        finally:  # (it keeps what it made, by node, for a document's aliases: a value is asked once)
            scalars.constructed_objects.clear()
            scalars.recursive_objects.clear()

    def text(self) -> str:
        v = self.value()
        if isinstance(v, int | float) and not isinstance(v, bool):
            raise self.error(f"expected a name, got the number {v!r} (quote it, as Kubernetes wants: {self.node.value!r})")
        if not isinstance(v, str) or not v:
            raise self.error(f"expected a non-empty name, got {v!r}")
        return v

    def choice(self, options: tuple[str, ...]) -> str:
        v = self.value()
        if v not in options:
            raise self.error(f"expected one of {', '.join(options)}, got {v!r}")
        return str(v)

    def whole(self) -> int:
        v = self.value()
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.error(f"expected a whole number, got {v!r}")
        return v

    def quantity(self, resource: str) -> int:
        try:
            return quantity(self.value(), resource)
        except ValueError as e:
            raise self.error(str(e)) from None


def quantity(v: object, resource: str) -> int:
    """A Kubernetes quantity in the resource's base unit, rounded up (as Kubernetes rounds);
    ValueError saying what is wrong with it."""
    m = _QUANTITY.fullmatch(str(v).strip()) if not isinstance(v, bool) and v is not None else None
    if m is None:
        raise ValueError(f"expected a quantity (e.g. 8, 500m, 36Gi), got {v!r}")
    most = _MOST.get(resource, _MOST_OTHER)
    try:
        amount = Decimal(m[1]) * _SUFFIX[m[2]] * _SCALE.get(resource, 1)
        if amount < 0:
            raise ValueError(f"must not be negative, got {v!r}")
        if amount > most:
            raise ValueError(f"{v} is more than any cluster could hold (at most "
                             f"{most / _SCALE.get(resource, 1):g} for {resource})")
        return int(amount.to_integral_value(rounding=ROUND_CEILING))
    except DecimalException:  # beyond Decimal's own range (e.g. 1e999999)
        raise ValueError(f"{v} is more than any cluster could hold") from None


# libyaml's parser where PyYAML was built with it: the same nodes and marks, three times as fast
# (Kueue's large-scale scenario, 2,000 objects: 3.9 s -> 1.4 s). It refuses deep nesting itself.
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def too_deep(e: yaml.YAMLError) -> bool:
    """Whether the parser refused the text for its nesting (libyaml's own limit)."""
    return "nesting depth" in str(getattr(e, "problem", "") or "")


def error_line(e: yaml.YAMLError, text: str) -> int | None:
    """The line a parser's error is on, 1-based (None: it has none). libyaml puts an error at the
    end of the text on the line after the last: it is the last line's."""
    mark = getattr(e, "problem_mark", None)
    return None if mark is None else min(mark.line + 1, max(len(text.splitlines()), 1))


def _kind(node: yaml.Node) -> str:
    return {yaml.MappingNode: "a mapping", yaml.SequenceNode: "a list"}.get(type(node), "a value")


def read_kueue(path: str | Path, cluster: ClusterSpec) -> tuple[Partition, list[str]]:
    """The partition of ``path`` on ``cluster`` and the warnings (one per kind and field accepted but not modelled, with the first line it is on)."""
    path = str(path)
    text = read_text(path, most=MAX_FILE_BYTES, what="a partition file")
    read = _Read(path, cluster)
    seen = 0
    try:
        # (JSON, as `kubectl get -o json` writes it, is YAML too: one document, with its lines.)
        for i, node in enumerate(yaml.compose_all(text, Loader=YAML_LOADER), 1):
            if i > MAX_DOCUMENTS:  # (empty ones too: each is parsed)
                raise UserError(f"{path}: more than {MAX_DOCUMENTS:,} documents; a partition file may have at most "
                                f"{MAX_DOCUMENTS:,}")
            if node is None or (isinstance(node, yaml.ScalarNode) and node.value in ("", "~", "null")):
                continue
            for at in _objects(_At(read, node, i, "", "")):
                seen += 1
                if seen > MAX_DOCUMENTS:
                    raise UserError(f"{path}: more than {MAX_DOCUMENTS:,} objects; a partition file may have at "
                                    f"most {MAX_DOCUMENTS:,}")
                _document(read, at)
    except yaml.YAMLError as e:
        if too_deep(e):
            raise UserError(f"{path}: nested too deeply to be a Kueue object") from None
        raise InputFileError(path, error_line(e, text), None, f"bad YAML: {getattr(e, 'problem', None) or e}") from None
    except RecursionError:
        raise UserError(f"{path}: nested too deeply to be a Kueue object") from None
    if not seen:
        raise UserError(f"{path}: no Kueue objects in this file")
    return _resolve(read)


def _scalar_field(node: yaml.Node, name: str) -> str | None:
    """A mapping node's scalar field, read without checking anything else of it."""
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == name and isinstance(v, yaml.ScalarNode):
                return str(v.value)
    return None


def _objects(at: _At) -> list[_At]:
    """A document's objects: itself, or the items of a ``kind: List`` (apiVersion v1, what
    ``kubectl get`` of several objects gives), each named by its index in the errors."""
    if _scalar_field(at.node, "kind") != LIST_KIND:
        return [at]
    top = at.fields(("apiVersion", "kind", "items"), (), ("metadata",))
    api = top["apiVersion"].text() if "apiVersion" in top else None
    if api != LIST_API:
        raise (top.get("apiVersion") or at).error(f"a List is apiVersion {LIST_API}, not {api!r}")
    if "items" not in top:
        return []
    return [_At(at.read, item.node, f"{at.doc}, {item.path}", "", "") for item in top["items"].items()]


def _document(read: _Read, at: _At) -> None:
    if _is_configuration(at):
        _configuration(read, at)
        return
    kind = _scalar_field(at.node, "kind")
    if kind in _TRACE_KINDS:
        raise at.error(f"a {kind} is a job's record, not part of a partition: read a {kind} list as a trace "
                       f"(analysim trace convert --format {_TRACE_KINDS[kind]} FILE --out trace.csv)")
    top = at.fields(("apiVersion", "kind", "metadata", "spec", "value", "description"), (), ("status",))
    for need in ("apiVersion", "kind", "metadata"):
        if need not in top:
            raise at.error(f"{need}: missing")
    kind = top["kind"].text()
    if kind not in VERSIONS:
        raise top["kind"].error(f"unknown kind {kind!r}; known: {', '.join(VERSIONS)}")
    api = top["apiVersion"].text()
    group, _, version = api.partition("/")
    if group != GROUP or version not in VERSIONS[kind]:
        raise top["apiVersion"].error(f"{kind} is {', '.join(GROUP + '/' + v for v in VERSIONS[kind])}, not {api!r}")
    meta = top["metadata"].fields(_READ_METADATA, (), tuple(f for f in _METADATA if f not in _READ_METADATA))
    if "name" not in meta:
        raise top["metadata"].error("name: missing")
    name = meta["name"].text()
    at.what = f"{kind} {name!r}"
    for a in top.values():
        a.what = at.what
    if kind == "WorkloadPriorityClass":
        if "spec" in top:
            raise top["spec"].error("a WorkloadPriorityClass has value and description, no spec")
        if "value" not in top:
            raise at.error("value: missing")
        _once(read.priorities, name, top["value"].whole(), top["value"])
        return
    for f in ("value", "description"):
        if f in top:
            raise top[f].error(f"unknown field for a {kind}; known: apiVersion, kind, metadata, spec, status")
    spec = top.get("spec")
    if kind == "ResourceFlavor":
        _flavor(read, name, spec, at)
    elif kind == "ClusterQueue":
        _cluster_queue(read, name, spec, version, at)
    elif kind == "Cohort":
        _cohort(read, name, spec, version, at)
    else:
        _local_queue(read, meta["namespace"].text() if "namespace" in meta else "", name, spec, at)


def _is_configuration(at: _At) -> bool:
    """Whether the document is Kueue's Configuration (apiVersion config.kueue.x-k8s.io/...)."""
    api = _scalar_field(at.node, "apiVersion")
    return api is not None and api.partition("/")[0] == CONFIG_GROUP


def _configuration(read: _Read, at: _At) -> None:
    """Kueue's Configuration: ``fairSharing: {enable, preemptionStrategies}`` turns fair sharing on."""
    at.what = "Configuration"
    top = at.fields(("apiVersion", "kind", "metadata", "fairSharing"), _CONFIG_UNMODELLED)
    version = top["apiVersion"].text().partition("/")[2]
    if version not in CONFIG_VERSIONS:
        raise top["apiVersion"].error(f"Configuration is {', '.join(CONFIG_GROUP + '/' + v for v in CONFIG_VERSIONS)}, "
                                      f"not {top['apiVersion'].text()!r}")
    if "kind" not in top or top["kind"].text() != "Configuration":
        raise (top.get("kind") or at).error(f"{CONFIG_GROUP} objects are of kind Configuration")
    if read.configured:
        raise at.error("a second Configuration")
    read.configured = True
    if "fairSharing" not in top:
        return
    fs = top["fairSharing"].fields(("enable", "preemptionStrategies"))
    enable = False
    if "enable" in fs:
        v = fs["enable"].value()
        if not isinstance(v, bool):
            raise fs["enable"].error(f"expected true or false, got {v!r}")
        enable = v
    strategies = FAIR_STRATEGIES
    if "preemptionStrategies" in fs:
        strategies = tuple(s.choice(FAIR_STRATEGIES) for s in fs["preemptionStrategies"].items())
        if not strategies:
            raise fs["preemptionStrategies"].error("expected at least one strategy")
    if enable:
        read.fair_sharing = FairSharing(strategies)


def _weight(at: _At) -> float:
    """A fairSharing block's weight (a quantity; 1 without one)."""
    f = at.fields(("weight",))
    if "weight" not in f:
        return 1.0
    return f["weight"].quantity(WEIGHT) / 1000


def _preemption(at: _At) -> Preemption:
    """A ClusterQueue's spec.preemption."""
    p = at.fields(("reclaimWithinCohort", "withinClusterQueue", "borrowWithinCohort"))
    reclaim = p["reclaimWithinCohort"].choice(RECLAIM_WITHIN_COHORT) if "reclaimWithinCohort" in p else NEVER
    within = p["withinClusterQueue"].choice(WITHIN_CLUSTER_QUEUE) if "withinClusterQueue" in p else NEVER
    borrow, threshold = NEVER, None
    if "borrowWithinCohort" in p:
        b = p["borrowWithinCohort"].fields(("policy", "maxPriorityThreshold"))
        borrow = b["policy"].choice(BORROW_WITHIN_COHORT) if "policy" in b else NEVER
        if "maxPriorityThreshold" in b:
            threshold = b["maxPriorityThreshold"].whole()
    return Preemption(within, reclaim, borrow, threshold)


def _once(table: dict, name: str, value: Any, at: _At) -> None:
    if name in table:
        raise at.error(f"a second object named {name!r} of this kind")
    table[name] = value


def _flavor(read: _Read, name: str, spec: _At | None, at: _At) -> None:
    labels: dict[str, str] = {}
    if spec is not None and spec.node.tag != "tag:yaml.org,2002:null":
        f = spec.fields(("nodeLabels",), ("nodeTaints", "tolerations", "topologyName"))
        if "nodeLabels" in f:
            nl = f["nodeLabels"]
            if not isinstance(nl.node, yaml.MappingNode):
                raise nl.error(f"expected a mapping of labels, got {_kind(nl.node)}")
            for k, v in nl.node.value:
                labels[str(k.value)] = str(nl.child(v, str(k.value)).value())
    from analysim.partitions import node_labels

    nodes = tuple(n.name for n in read.cluster.nodes
                  if all(node_labels(n).get(k) == v for k, v in labels.items()))
    if not nodes:
        where = spec if spec is not None else at
        raise where.error(f"nodeLabels {labels} match no node of cluster {read.cluster.name!r} "
                          "(node labels: kubernetes.io/hostname, nvidia.com/gpu.product, nvidia.com/gpu.count, "
                          "analysim.io/gpu-model, analysim.io/rack)")
    _once(read.flavors, name, (Flavor(name, nodes), at.line), at)


def _resource_groups(read: _Read, at: _At, owner: str) -> tuple[tuple[tuple[tuple[str, str], Quota], ...],
                                                                tuple[ResourceGroup, ...]]:
    quotas: list[tuple[tuple[str, str], Quota]] = []
    groups: list[ResourceGroup] = []
    flavor_seen: set[str] = set()
    resource_seen: set[str] = set()
    for g in at.items():
        gf = g.fields(("coveredResources", "flavors"))
        for need in ("coveredResources", "flavors"):
            if need not in gf:
                raise g.error(f"{need}: missing")
        covered = tuple(r.text() for r in gf["coveredResources"].items())
        for r, ra in zip(covered, gf["coveredResources"].items(), strict=True):
            if r in resource_seen:
                raise ra.error(f"resource {r!r} is covered by two resource groups")
            resource_seen.add(r)
            if r not in MODELLED_RESOURCES:
                read.warn(owner, f"{ra.path} ({r})", ra.line)
        names: list[str] = []
        for fl in gf["flavors"].items():
            ff = fl.fields(("name", "resources"))
            if "name" not in ff:
                raise fl.error("name: missing")
            fname = ff["name"].text()
            if fname in flavor_seen:
                raise ff["name"].error(f"flavor {fname!r} is in two resource groups (or twice in one)")
            flavor_seen.add(fname)
            names.append(fname)
            given: set[str] = set()
            for res in (ff["resources"].items() if "resources" in ff else []):
                rf = res.fields(("name", "nominalQuota", "borrowingLimit", "lendingLimit"))
                if "name" not in rf or "nominalQuota" not in rf:
                    raise res.error(f"{'name' if 'name' not in rf else 'nominalQuota'}: missing")
                rname = rf["name"].text()
                if rname not in covered:
                    raise rf["name"].error(f"resource {rname!r} is not in this group's coveredResources {list(covered)}")
                if rname in given:
                    raise rf["name"].error(f"resource {rname!r} given twice for flavor {fname!r}")
                given.add(rname)
                nominal = rf["nominalQuota"].quantity(rname)
                bl = rf["borrowingLimit"].quantity(rname) if "borrowingLimit" in rf else None
                ll = rf["lendingLimit"].quantity(rname) if "lendingLimit" in rf else None
                if ll is not None and ll > nominal and owner == "ClusterQueue":  # (a Cohort's lends its subtree's)
                    raise rf["lendingLimit"].error(f"lendingLimit {ll} is more than nominalQuota {nominal} "
                                                   "(in base units)")
                quotas.append(((fname, rname), Quota(nominal, bl, ll)))
            missing = [r for r in covered if r not in given]
            if missing:
                raise fl.error(f"flavor {fname!r} gives no quota for covered resource(s) {', '.join(missing)}")
        groups.append(ResourceGroup(covered, tuple(names)))
    return tuple(quotas), tuple(groups)


def _cluster_queue(read: _Read, name: str, spec: _At | None, version: str, at: _At) -> None:
    if spec is None:
        raise at.error("spec: missing")
    cohort_field = "cohort" if version == "v1beta1" else "cohortName"
    f = spec.fields((cohort_field, "resourceGroups", "queueingStrategy", "flavorFungibility", "namespaceSelector",
                     "preemption", "stopPolicy", "fairSharing"),
                    ("admissionChecks", "admissionChecksStrategy", "admissionScope"))
    cohort = f[cohort_field].text() if cohort_field in f else ""
    quotas, groups = _resource_groups(read, f["resourceGroups"], "ClusterQueue") if "resourceGroups" in f else ((), ())
    strategy = f["queueingStrategy"].choice((STRICT_FIFO, BEST_EFFORT_FIFO)) if "queueingStrategy" in f else BEST_EFFORT_FIFO
    try_next, try_next_preempting, preference = False, True, BORROWING_OVER_PREEMPTION
    if "flavorFungibility" in f:
        # (v1beta1 says Borrow and Preempt where v1beta2 says MayStopSearch; both are taken)
        ff = f["flavorFungibility"].fields(("whenCanBorrow", "whenCanPreempt", "preference"))
        if "whenCanBorrow" in ff:
            try_next = ff["whenCanBorrow"].choice(("Borrow", "MayStopSearch", "TryNextFlavor")) == "TryNextFlavor"
        if "whenCanPreempt" in ff:
            try_next_preempting = ff["whenCanPreempt"].choice(("Preempt", "MayStopSearch", "TryNextFlavor")) == "TryNextFlavor"
        if "preference" in ff:
            preference = ff["preference"].choice((BORROWING_OVER_PREEMPTION, PREEMPTION_OVER_BORROWING))
            if not (try_next and try_next_preempting):
                # (Kueue's validation: a preference chooses among flavors the search went past)
                raise ff["preference"].error("preference needs whenCanBorrow and whenCanPreempt both TryNextFlavor")
    if "namespaceSelector" in f:
        sel = f["namespaceSelector"]
        if not (isinstance(sel.node, yaml.MappingNode) and not sel.node.value):
            read.warn("ClusterQueue", sel.path + " (not {}: jobs reach a ClusterQueue by their LocalQueue)", sel.line)
    preemption = _preemption(f["preemption"]) if "preemption" in f else Preemption()
    weight = _weight(f["fairSharing"]) if "fairSharing" in f else 1.0
    if "stopPolicy" in f and f["stopPolicy"].choice(("None", "Hold", "HoldAndDrain")) != "None":
        read.warn("ClusterQueue", f["stopPolicy"].path + " (not None)", f["stopPolicy"].line)
    node = PartitionNode(name, True, cohort or None, quotas, groups, strategy, try_next, preemption, weight,
                         try_next_preempting, preference)
    if name in read.cqs:
        raise at.error(f"a second ClusterQueue named {name!r}")
    read.cqs[name] = (node, at.line, cohort)


def _cohort(read: _Read, name: str, spec: _At | None, version: str, at: _At) -> None:
    parent_field = "parentName" if version == "v1beta2" else "parent"
    parent, quotas, weight = None, (), 1.0
    if spec is not None and spec.node.tag != "tag:yaml.org,2002:null":
        f = spec.fields((parent_field, "resourceGroups", "fairSharing"))
        parent = f[parent_field].text() if parent_field in f else None
        if "resourceGroups" in f:
            quotas, _ = _resource_groups(read, f["resourceGroups"], "Cohort")
        if "fairSharing" in f:
            weight = _weight(f["fairSharing"])
    _once(read.cohorts, name, (PartitionNode(name, False, parent, quotas, weight=weight), at.line), at)


def _local_queue(read: _Read, namespace: str, name: str, spec: _At | None, at: _At) -> None:
    if spec is None:
        raise at.error("spec: missing")
    f = spec.fields(("clusterQueue",), ("stopPolicy", "fairSharing"))
    if "clusterQueue" not in f:
        raise spec.error("clusterQueue: missing")
    if (namespace, name) in read.local:
        raise at.error(f"a second LocalQueue named {name!r}" + (f" in namespace {namespace!r}" if namespace else ""))
    read.local[(namespace, name)] = (f["clusterQueue"].text(), f["clusterQueue"].line)


def local_queue_names(local: dict[tuple[str, str], Any]) -> dict[tuple[str, str], str]:
    """The name each LocalQueue has in the partition (and jobs' VCs): its own name, or, when
    LocalQueues of two namespaces have that name, ``namespace/name``."""
    namespaces: dict[str, int] = {}
    for _, name in local:
        namespaces[name] = namespaces.get(name, 0) + 1
    return {(ns, name): f"{ns}/{name}" if namespaces[name] > 1 else name for ns, name in local}


def _resolve(read: _Read) -> tuple[Partition, list[str]]:
    """Check the references between objects and build the partition."""
    p = read.path

    def err(line: int, problem: str) -> InputFileError:
        return InputFileError(p, line, None, problem)

    if not read.cqs:
        raise UserError(f"{p}: no ClusterQueue: jobs have nowhere to be admitted")
    for cq, (node, line, _) in read.cqs.items():
        for g in node.groups:
            for fl in g.flavors:
                if fl not in read.flavors:
                    raise err(line, f"ClusterQueue {cq!r}: no ResourceFlavor {fl!r} in this file")
    for name, (node, line) in read.cohorts.items():
        if name in read.cqs:
            raise err(line, f"Cohort {name!r} has the name of a ClusterQueue")
        for (fl, _), _q in node.quotas:
            if fl not in read.flavors:
                raise err(line, f"Cohort {name!r}: no ResourceFlavor {fl!r} in this file")
    # Cohorts named only by a ClusterQueue's or a Cohort's reference exist implicitly (Kueue's rule).
    cohorts = {name: node for name, (node, _) in read.cohorts.items()}
    refs = [(ref, line) for _, (_, line, ref) in read.cqs.items() if ref]
    refs += [(n.parent, line) for n, line in read.cohorts.values() if n.parent]
    for ref, line in refs:
        if ref in read.cqs:
            raise err(line, f"cohort {ref!r} is the name of a ClusterQueue")
        cohorts.setdefault(ref, PartitionNode(ref, False, None))
    if not read.local:
        raise UserError(f"{p}: no LocalQueue: jobs reach a ClusterQueue through a LocalQueue named like their VC")
    names = local_queue_names(read.local)
    for key, (cq, line) in read.local.items():
        if cq not in read.cqs:
            raise err(line, f"LocalQueue {names[key]!r}: no ClusterQueue {cq!r} in this file")
    nodes = tuple(list(cohorts.values()) + [n for n, _, _ in read.cqs.values()])
    partition = Partition(tuple(f for f, _ in read.flavors.values()), nodes,
                          tuple(sorted((names[key], cq) for key, (cq, _) in read.local.items())),
                          tuple(sorted(read.priorities.items())), source=p, fair_sharing=read.fair_sharing)
    try:
        QuotaTree(partition)
    except ValueError as e:
        raise UserError(f"{p}: {e}") from None
    warnings = [f"{p}, line {line}: {kind} {path}: accepted but not modelled (docs/kueue.md)"
                for (kind, path), line in sorted(read.warned.items(), key=lambda kv: kv[1])]
    return partition, warnings
