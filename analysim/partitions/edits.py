"""``--partition-set KIND/NAME/FLAVOR/RESOURCE/FIELD=VALUE``: one quota field of a partition file
changed for a run, as an operator asks "what would borrowingLimit: 16 on team A do?" (and a
sweep's axis over it: docs/kueue.md, docs/sweep.md).

- KIND: ``ClusterQueue`` or ``Cohort``; NAME: the object's name;
- FLAVOR, RESOURCE: a flavor and resource the object has a quota for (``v100``, ``nvidia.com/gpu``:
  a resource name may have a slash, a Kubernetes name may not, so FIELD is the last step and
  RESOURCE what is between FLAVOR and FIELD);
- FIELD: ``nominalQuota``, ``borrowingLimit`` or ``lendingLimit``;
- VALUE: a Kubernetes quantity (``16``, ``500m``, ``64Gi``), or ``none`` for no limit.

A path that names nothing in the file, or a value the file could not hold (a ClusterQueue's
lendingLimit above its nominalQuota), is a one-line error naming the setting and the file.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from analysim.core.partition import Partition, PartitionNode, QuotaTree
from analysim.errors import UserError

KINDS = ("ClusterQueue", "Cohort")
# YAML field -> Quota field
FIELDS = {"nominalQuota": "nominal", "borrowingLimit": "borrowing_limit", "lendingLimit": "lending_limit"}
SYNTAX = "KIND/NAME/FLAVOR/RESOURCE/FIELD=VALUE, e.g. ClusterQueue/team-a/v100/nvidia.com/gpu/borrowingLimit=16"


@dataclass(frozen=True)
class FieldPath:
    """Where a setting points: a quota field of one object, flavor and resource."""

    kind: str
    name: str
    flavor: str
    resource: str
    field: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}/{self.flavor}/{self.resource}/{self.field}"


def parse_path(text: str) -> FieldPath:
    """``KIND/NAME/FLAVOR/RESOURCE/FIELD``; UserError for one that is not of that shape."""
    steps = text.strip().split("/")
    if len(steps) < 5 or not all(steps):
        raise UserError(f"{text}: expected {SYNTAX.split('=')[0]} (e.g. "
                        "ClusterQueue/team-a/v100/nvidia.com/gpu/borrowingLimit)")
    kind, name, flavor, *resource, fld = steps
    if kind not in KINDS:
        raise UserError(f"{text}: {kind!r} is not a kind with quotas; known: {', '.join(KINDS)}")
    if fld not in FIELDS:
        raise UserError(f"{text}: {fld!r} is not a quota field; known: {', '.join(FIELDS)}")
    return FieldPath(kind, name, flavor, "/".join(resource), fld)


def parse_setting(text: str) -> tuple[FieldPath, str]:
    """``PATH=VALUE`` as (path, value text)."""
    path, eq, value = text.partition("=")
    if not eq or not value.strip():
        raise UserError(f"--partition-set {text}: expected {SYNTAX}")
    return parse_path(path), value.strip()


def apply_settings(partition: Partition, settings: list[str] | tuple[str, ...]) -> Partition:
    """The partition with each ``PATH=VALUE`` setting applied, in order."""
    for text in settings:
        try:
            partition = _apply(partition, *parse_setting(text))
        except UserError as e:
            msg = str(e)
            raise UserError(msg if msg.startswith("--partition-set") else f"--partition-set {msg}") from None
    try:
        QuotaTree(partition)
    except ValueError as e:
        raise UserError(f"--partition-set: {partition.source}: {e}") from None
    return partition


def _apply(partition: Partition, path: FieldPath, value: str) -> Partition:
    from analysim.partitions.kueue import quantity

    src = partition.source
    is_queue = path.kind == "ClusterQueue"
    nodes = [n for n in partition.nodes if n.name == path.name and n.is_queue == is_queue]
    if not nodes:
        have = sorted(n.name for n in partition.nodes if n.is_queue == is_queue)
        raise UserError(f"{path}: {src} has no {path.kind} {path.name!r}; it has {', '.join(have) or 'none'}")
    node: PartitionNode = nodes[0]
    quotas = dict(node.quotas)
    fr = (path.flavor, path.resource)
    if fr not in quotas:
        have = ", ".join(f"{f}/{r}" for f, r in quotas) or "none"
        raise UserError(f"{path}: {path.kind} {path.name!r} in {src} has no quota of flavor {path.flavor!r} "
                        f"and resource {path.resource!r}; it has {have}")
    if value.lower() == "none":
        if path.field == "nominalQuota":
            raise UserError(f"{path}=none: a nominalQuota is a quantity (none is for a borrowingLimit or lendingLimit)")
        amount = None
    else:
        try:
            amount = quantity(value, path.resource)
        except ValueError as e:
            raise UserError(f"{path}={value}: {e}") from None
    quota = dataclasses.replace(quotas[fr], **{FIELDS[path.field]: amount})
    if is_queue and quota.lending_limit is not None and quota.lending_limit > quota.nominal:
        raise UserError(f"{path}={value}: {path.kind} {path.name!r} would lend more than its nominalQuota "
                        f"({quota.lending_limit} > {quota.nominal} in base units)")
    quotas[fr] = quota
    new = dataclasses.replace(node, quotas=tuple(quotas.items()))
    return dataclasses.replace(partition, nodes=tuple(new if n is node else n for n in partition.nodes))
