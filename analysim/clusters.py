"""Cluster specifications from the command line: a preset name, ``NxG[:MODEL]``, a JSON/YAML/TOML
file, or an Alibaba openb node list CSV. See docs/clusters.md for the file format and the presets."""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from analysim.core.cluster import ClusterSpec, NodeSpec, VCSpec
from analysim.errors import InputFileError, UserError, read_text
from analysim.traces.base import CsvInput

DEFAULT_MODEL = "V100"
RACK_SIZE = 16  # nodes per rack when a spec does not say: a 42U rack of 2U/4U GPU servers holds ~8-20
# Per-GPU host resources when a spec does not say, from an NVIDIA DGX-1 (8x V100): 2x Xeon E5-2698 v4,
# 40 cores = 80 hardware threads, counted as 80 CPUs the way Kubernetes does, and 512 GiB of RAM.
CPU_MILLI_PER_GPU = 10_000
MEMORY_MIB_PER_GPU = 64 * 1024

# Share of the Philly extract's GPU-time per virtual cluster (sum of duration x num_gpus per VC over
# ../shared/traces/philly.csv, 2017-09-04..2017-12-22, 978,078 GPU-hours; bench/fit_philly.py).
PHILLY_VC_GPU_TIME_SHARE = (
    ("ee9e8c", 0.261852), ("7f04ca", 0.168627), ("b436b2", 0.128558), ("6214e9", 0.099363),
    ("6c71a0", 0.084046), ("2869ce", 0.082504), ("0e4a51", 0.079295), ("103959", 0.043841),
    ("11cb48", 0.028734), ("e13805", 0.013862), ("ed69ec", 0.009138), ("23dbec", 0.000160),
    ("51b7ef", 0.000012), ("795a4c", 0.000005), ("925e2b", 0.000003),
)  # fmt: skip

# Alibaba openb node classes (cpu_milli, memory_mib, gpus, model) -> nodes, counted from
# openb_node_list_gpu_node.csv of alibaba/clusterdata cluster-trace-gpu-v2023: 1,213 nodes, 6,212 GPUs.
OPENB_NODE_CLASSES = (
    ((96000, 393216, 8, "G2"), 549),
    ((104000, 524288, 2, "T4"), 387),
    ((16000, 122880, 2, "P100"), 107),
    ((128000, 786432, 8, "G3"), 39),
    ((32000, 131072, 4, "V100M16"), 28),
    ((64000, 262144, 2, "P100"), 22),
    ((96000, 786432, 8, "V100M32"), 21),
    ((8000, 32768, 1, "V100M16"), 19),
    ((96000, 393216, 4, "T4"), 17),
    ((48000, 376832, 4, "V100M32"), 9),
    ((64000, 262144, 8, "V100M16"), 7),
    ((8000, 61440, 1, "P100"), 3),
    ((8000, 61440, 2, "P100"), 2),
    ((128000, 1048576, 1, "A10"), 2),
    ((82000, 344064, 8, "V100M16"), 1),
)


def proportional_quotas(shares: Sequence[tuple[str, float]], total: int, floor: int = 1) -> dict[str, int]:
    """Whole-GPU quotas summing exactly to ``total``: ``floor`` each, so that every tenant can run a
    small job without borrowing, and the rest split by share, by largest remainder."""
    rest = total - floor * len(shares)
    if rest < 0:
        raise ValueError(f"{total} GPUs cannot give {len(shares)} VCs {floor} each")
    weight = sum(s for _, s in shares)
    raw = [s / weight * rest for _, s in shares]
    quotas = [floor + int(r) for r in raw]
    by_remainder = sorted(range(len(raw)), key=lambda i: (-(raw[i] - int(raw[i])), i))
    for i in by_remainder[: total - sum(quotas)]:
        quotas[i] += 1
    return {name: q for (name, _), q in zip(shares, quotas, strict=True)}


def _racked_nodes(
    count: int, gpus: int, model: str, cpu_milli: int, memory_mib: int, rack_size: int = RACK_SIZE,
    prefix: str = "node", first: int = 0, first_rack: int = 0,
) -> list[NodeSpec]:  # fmt: skip
    width = max(4, len(str(first + count - 1)))
    return [
        NodeSpec(
            name=f"{prefix}-{first + i:0{width}d}",
            rack=f"rack-{first_rack + i // rack_size:02d}",
            gpu_model=model,
            gpus=gpus,
            cpu_milli=cpu_milli,
            memory_mib=memory_mib,
        )
        for i in range(count)
    ]


def uniform_cluster(
    name: str, nodes: int, gpus: int, model: str = DEFAULT_MODEL, rack_size: int = RACK_SIZE,
    vcs: tuple[VCSpec, ...] = (), description: str = "",
) -> ClusterSpec:  # fmt: skip
    """``nodes`` identical nodes of ``gpus`` GPUs with DGX-1-like CPU and memory per GPU."""
    node_list = _racked_nodes(
        nodes, gpus, model, gpus * CPU_MILLI_PER_GPU, gpus * MEMORY_MIB_PER_GPU, rack_size
    )
    return ClusterSpec(name=name, nodes=tuple(node_list), vcs=vcs, description=description)


def _quota_vcs(total: int) -> tuple[VCSpec, ...]:
    q = proportional_quotas(PHILLY_VC_GPU_TIME_SHARE, total)
    return tuple(VCSpec(name=v, quota_gpus=float(g)) for v, g in q.items())


def _philly() -> ClusterSpec:
    return uniform_cluster(
        "philly", 64, 8, vcs=_quota_vcs(512),
        description="64 nodes x 8 V100 in 4 racks, 15 Philly VCs with quotas by GPU-time share",
    )  # fmt: skip


def _demo() -> ClusterSpec:
    return uniform_cluster(
        "demo", 16, 8, rack_size=4, vcs=_quota_vcs(128),
        description="16 nodes x 8 V100 in 4 racks, the 15 Philly VCs with quotas by GPU-time share",
    )  # fmt: skip


def _helios_venus() -> ClusterSpec:
    return uniform_cluster(
        "helios-venus", 135, 8, description="135 nodes x 8 V100 (1,080 GPUs), SenseTime Helios Venus"
    )


def _tiny() -> ClusterSpec:
    return uniform_cluster("tiny", 4, 8, description="4 nodes x 8 V100, one rack, for tests")


def _openb() -> ClusterSpec:
    classes = [c for c, count in OPENB_NODE_CLASSES for _ in range(count)]
    nodes = tuple(
        NodeSpec(f"openb-node-{i:04d}", f"rack-{i // RACK_SIZE:02d}", model, gpus, cpu, mem)
        for i, (cpu, mem, gpus, model) in enumerate(classes)
    )
    return ClusterSpec(
        "openb", nodes, description="Alibaba openb GPU nodes (2023): 1,213 nodes, 6,212 GPUs, 7 models"
    )


# name -> (builder, one-line help). Sizes and sources are documented in docs/clusters.md.
PRESETS: dict[str, tuple[Callable[[], ClusterSpec], str]] = {
    "philly": (_philly, "64x8 V100, 15 VCs: sized for the Philly extract's ~374 busy GPUs"),
    "helios-venus": (_helios_venus, "135x8 V100 (1,080 GPUs): SenseTime Helios Venus (SC'21)"),
    "openb": (_openb, "Alibaba openb 2023: 1,213 heterogeneous nodes, 6,212 GPUs"),
    "demo": (_demo, "16x8 V100 in 4 racks, Philly VCs: for the built-in synthetic trace"),
    "tiny": (_tiny, "4x8 V100, one rack: for tests"),
}

_SHORTHAND = re.compile(r"(\d+)x(\d+)(?::([A-Za-z0-9][\w.-]*))?")


def split_nodes(total: int, agents: int) -> list[tuple[int, int]]:
    """(first node, count) for each of ``agents`` node agents sharing ``total`` nodes, as even
    as possible (fewer slices when there are more agents than nodes)."""
    agents = max(1, min(agents, total))
    per = math.ceil(total / agents)
    return [(i, min(per, total - i)) for i in range(0, total, per)]


def agent_slice(total: int, agents: int, index: int) -> tuple[int, int]:
    """The slice of agent ``index`` (0-based) of ``agents``: a StatefulSet's ordinal or a
    compose service's index picks its nodes, so the fleet scales without naming nodes."""
    slices = split_nodes(total, agents)
    if not 0 <= index < agents:
        raise UserError(f"agent index {index} is not in 0..{agents - 1}")
    if index >= len(slices):
        raise UserError(f"agent index {index}: {agents} agents for {total} nodes leave this one without nodes")
    return slices[index]


def list_presets() -> dict[str, str]:
    """Preset name -> one-line description, for help texts."""
    return {name: text for name, (_, text) in PRESETS.items()}


def parse_cluster(spec: str) -> ClusterSpec:
    """A cluster from a preset name, ``NxG[:MODEL]``, a .json/.yaml/.yml/.toml file or an openb
    node list .csv."""
    if spec in PRESETS:
        return PRESETS[spec][0]()
    m = _SHORTHAND.fullmatch(spec)
    if m:
        nodes, gpus = int(m[1]), int(m[2])
        if nodes < 1 or gpus < 1:
            raise UserError(f"cluster {spec!r}: needs at least one node and one GPU per node")
        model = m[3] or DEFAULT_MODEL
        return uniform_cluster(spec, nodes, gpus, model, description=f"{nodes} nodes x {gpus} {model}")
    path = Path(spec)
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix == ".csv":
            return _from_node_list(path)
        if suffix in _LOADERS:
            return _from_mapping(_load_file(path), path)
        raise UserError(
            f"{spec}: unknown cluster file type {suffix!r}; use .json, .yaml, .yml, .toml or .csv"
        )
    raise UserError(
        f"unknown cluster {spec!r}: not a preset ({', '.join(PRESETS)}), not NODESxGPUS[:MODEL] "
        "(e.g. 64x8:V100), and no such file"
    )


# --- files -------------------------------------------------------------------------------------


def _json(text: str, path: Path) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise InputFileError(str(path), e.lineno, None, f"bad JSON: {e.msg}") from None


def _yaml(text: str, path: Path) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e)
        raise InputFileError(
            str(path), mark.line + 1 if mark else None, None, f"bad YAML: {problem}"
        ) from None


def _toml(text: str, path: Path) -> Any:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InputFileError(str(path), None, None, f"bad TOML: {e}") from None


_LOADERS: dict[str, Callable[[str, Path], Any]] = {
    ".json": _json,
    ".yaml": _yaml,
    ".yml": _yaml,
    ".toml": _toml,
}


def _load_file(path: Path) -> Any:
    return _LOADERS[path.suffix.lower()](read_text(path), path)


class _Fields:
    """Checks values of a parsed spec file; errors name the file and the field path."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def error(self, where: str, problem: str) -> UserError:
        return UserError(f"{self.path}: {where}: {problem}")

    def mapping(self, value: Any, where: str, allowed: Sequence[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.error(where, f"expected a mapping of fields, got {_kind(value)}")
        unknown = [k for k in value if k not in allowed]
        if unknown:
            raise self.error(
                where, f"unknown field(s) {', '.join(map(str, unknown))}; known: {', '.join(allowed)}"
            )
        return value

    def whole(self, value: Any, where: str, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(where, f"expected a whole number, got {value!r}")
        if value < minimum:
            raise self.error(where, f"must be at least {minimum}, got {value}")
        return value

    def number(self, value: Any, where: str) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not value >= 0
            or value == float("inf")
        ):
            raise self.error(where, f"expected a finite number >= 0, got {value!r}")
        return float(value)

    def name(self, value: Any, where: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.error(where, f"expected a non-empty name, got {value!r}")
        return value

    def flag(self, value: Any, where: str) -> bool:
        if not isinstance(value, bool):
            raise self.error(where, f"expected true or false, got {value!r}")
        return value


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__


_TOP = (
    "name",
    "description",
    "nodes",
    "vcs",
    "allow_borrowing",
    "cross_node_slowdown",
    "cross_rack_slowdown",
)
_GROUP = ("count", "gpus", "gpu_model", "cpu_milli", "memory_mib", "rack_size", "rack", "name_prefix")
_VC = ("name", "quota_gpus", "nodes")


def _from_mapping(data: Any, path: Path) -> ClusterSpec:
    f = _Fields(path)
    top = f.mapping(data, "top level", _TOP)
    if "nodes" not in top:
        raise f.error("nodes", "missing: list the node groups")
    nodes = _node_groups(f, top["nodes"])
    vcs = _vcs(f, top.get("vcs", []), nodes)
    return ClusterSpec(
        name=f.name(top.get("name", path.stem), "name"),
        nodes=tuple(nodes),
        vcs=vcs,
        allow_borrowing=f.flag(top.get("allow_borrowing", True), "allow_borrowing"),
        cross_node_slowdown=f.number(top.get("cross_node_slowdown", 0.0), "cross_node_slowdown"),
        cross_rack_slowdown=f.number(top.get("cross_rack_slowdown", 0.0), "cross_rack_slowdown"),
        description=str(top.get("description", "")),
    )


def _node_groups(f: _Fields, groups: Any) -> list[NodeSpec]:
    if not isinstance(groups, list) or not groups:
        raise f.error("nodes", f"expected a non-empty list of node groups, got {_kind(groups)}")
    nodes: list[NodeSpec] = []
    numbered: dict[str, int] = {}  # name prefix -> nodes named so far
    racks = 0  # automatic racks used so far
    for i, raw in enumerate(groups):
        w = f"nodes[{i}]"
        g = f.mapping(raw, w, _GROUP)
        for key in ("count", "gpus"):
            if key not in g:
                raise f.error(f"{w}.{key}", "missing")
        count = f.whole(g["count"], f"{w}.count", 1)
        gpus = f.whole(g["gpus"], f"{w}.gpus", 1)
        model = f.name(g.get("gpu_model", DEFAULT_MODEL), f"{w}.gpu_model")
        cpu = f.whole(g.get("cpu_milli", gpus * CPU_MILLI_PER_GPU), f"{w}.cpu_milli", 0)
        mem = f.whole(g.get("memory_mib", gpus * MEMORY_MIB_PER_GPU), f"{w}.memory_mib", 0)
        prefix = f.name(g.get("name_prefix", "node"), f"{w}.name_prefix")
        if "rack" in g and "rack_size" in g:
            raise f.error(w, "give rack (one named rack) or rack_size (automatic racks), not both")
        rack_size = f.whole(g.get("rack_size", RACK_SIZE), f"{w}.rack_size", 1)
        group = _racked_nodes(count, gpus, model, cpu, mem, rack_size, prefix, numbered.get(prefix, 0), racks)
        if "rack" in g:
            rack = f.name(g["rack"], f"{w}.rack")
            group = [NodeSpec(n.name, rack, n.gpu_model, n.gpus, n.cpu_milli, n.memory_mib) for n in group]
        else:
            racks += -(-count // rack_size)
        numbered[prefix] = numbered.get(prefix, 0) + count
        nodes += group
    return nodes


def _vcs(f: _Fields, raw: Any, nodes: list[NodeSpec]) -> tuple[VCSpec, ...]:
    if not isinstance(raw, list):
        raise f.error("vcs", f"expected a list of virtual clusters, got {_kind(raw)}")
    gpus_of = {n.name: n.gpus for n in nodes}
    owner: dict[str, str] = {}
    out: list[VCSpec] = []
    for i, item in enumerate(raw):
        w = f"vcs[{i}]"
        v = f.mapping(item, w, _VC)
        if "name" not in v:
            raise f.error(f"{w}.name", "missing")
        name = f.name(v["name"], f"{w}.name")
        if any(o.name == name for o in out):
            raise f.error(f"{w}.name", f"duplicate VC name {name!r}")
        quota = f.number(v["quota_gpus"], f"{w}.quota_gpus") if "quota_gpus" in v else None
        dedicated = _dedicated(f, v.get("nodes", []), f"{w}.nodes", name, owner, nodes)
        out.append(VCSpec(name=name, quota_gpus=quota, nodes=dedicated))
    total = sum(gpus_of.values())
    quotas = sum(v.quota_gpus or 0.0 for v in out)
    if quotas > total + 1e-9:
        raise f.error("vcs", f"quotas add up to {quotas:g} GPUs, more than the cluster's {total}")
    return tuple(out)


def _dedicated(
    f: _Fields, raw: Any, where: str, vc: str, owner: dict[str, str], nodes: list[NodeSpec]
) -> tuple[str, ...]:
    """Node names given to a VC: a count takes the next nodes no other VC holds, in node order."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        count = f.whole(raw, where, 0)
        free = [n.name for n in nodes if n.name not in owner]
        if count > len(free):
            raise f.error(where, f"asks for {count} nodes, only {len(free)} are not dedicated to a VC")
        names = free[:count]
    elif isinstance(raw, list):
        names = [f.name(x, f"{where}[{j}]") for j, x in enumerate(raw)]
        known = {n.name for n in nodes}
        for j, name in enumerate(names):
            if name not in known:
                raise f.error(
                    f"{where}[{j}]", f"no node named {name!r} (nodes are named like {nodes[0].name})"
                )
            if name in owner:
                raise f.error(f"{where}[{j}]", f"node {name!r} is already dedicated to VC {owner[name]!r}")
    else:
        raise f.error(where, f"expected a node count or a list of node names, got {raw!r}")
    for name in names:
        owner[name] = vc
    return tuple(names)


def _from_node_list(path: Path) -> ClusterSpec:
    """An Alibaba openb node list (``sn,cpu_milli,memory_mib,gpu,model``); GPU-less nodes are left
    out and counted in the description. Racks are nominal, RACK_SIZE nodes in file order."""
    nodes: list[NodeSpec] = []
    skipped = 0
    with CsvInput(path, "openb node list", ("sn", "cpu_milli", "memory_mib", "gpu", "model")) as src:
        i_sn, i_model = src.index["sn"], src.index["model"]
        seen: dict[str, int] = {}
        for line, row in src.rows():
            gpus = src.int_field(row, "gpu", line)
            cpu = src.int_field(row, "cpu_milli", line)
            mem = src.int_field(row, "memory_mib", line)
            name, model = row[i_sn], row[i_model].strip()
            if not name:
                raise src.error(line, "sn", "empty node name")
            if name in seen:
                raise src.error(line, "sn", f"duplicate node {name!r} (first on line {seen[name]})")
            seen[name] = line
            if gpus == 0:
                skipped += 1
                continue
            if not model:
                raise src.error(line, "model", "a GPU node needs a GPU model")
            rack = f"rack-{len(nodes) // RACK_SIZE:02d}"
            nodes.append(NodeSpec(name, rack, model, gpus, cpu, mem))
    if not nodes:
        raise UserError(f"{path}: no GPU nodes in this node list")
    gpus_total = sum(n.gpus for n in nodes)
    note = f"; left out {skipped} nodes without GPUs" if skipped else ""
    return ClusterSpec(
        path.stem, tuple(nodes), description=f"{len(nodes)} nodes, {gpus_total} GPUs from {path.name}{note}"
    )
