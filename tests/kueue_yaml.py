"""Builders of Kueue YAML documents for tests: each returns the text of one object (or a
ClusterQueue with its LocalQueue), starting with a document separator, to be joined."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# A resource's quota fields (nominalQuota, borrowingLimit, lendingLimit) -> value.
Quota = Mapping[str, object]
# One resource group: its covered resources and, in order, each flavor with its quota per resource.
Group = tuple[Sequence[str], Sequence[tuple[str, Mapping[str, Quota]]]]


def resource_groups(groups: Sequence[Group]) -> str:
    """A ClusterQueue's or Cohort's ``resourceGroups`` spec lines."""
    out = "\n  resourceGroups:"
    for covered, flavors in groups:
        out += f"\n  - coveredResources: [{', '.join(covered)}]\n    flavors:"
        for flavor, quotas in flavors:
            out += f"\n    - name: {flavor}\n      resources:"
            for resource, fields in quotas.items():
                out += f"\n      - name: {resource}" + "".join(f"\n        {k}: {v}" for k, v in fields.items())
    return out


def _object(kind: str, name: str, rest: str) -> str:
    """A kueue.x-k8s.io/v1beta1 object with these lines after its metadata."""
    return f"""
---
apiVersion: kueue.x-k8s.io/v1beta1
kind: {kind}
metadata: {{name: {name}}}{rest}"""


def cohort_doc(name: str, spec: str) -> str:
    """A Cohort document with these spec lines (each after a newline and two spaces)."""
    return _object("Cohort", name, f"\nspec:{spec or ' {}'}")


def queue_docs(name: str, cohort: str | None, spec: str) -> str:
    """A ClusterQueue (of this cohort, if any) with these further spec lines, and the LocalQueue
    of its name."""
    cohort_line = f"\n  cohort: {cohort}" if cohort else ""
    return (_object("ClusterQueue", name, f"\nspec:\n  namespaceSelector: {{}}{cohort_line}{spec}")
            + _object("LocalQueue", name, f"\nspec: {{clusterQueue: {name}}}"))


def flavor_doc(name: str, node_labels: Mapping[str, str] | None = None) -> str:
    """A ResourceFlavor; without node labels it is every node."""
    return _object("ResourceFlavor", name, f"\nspec: {{nodeLabels: {dict(node_labels)}}}" if node_labels else "")


def priority_doc(name: str, value: int) -> str:
    """A WorkloadPriorityClass."""
    return _object("WorkloadPriorityClass", name, f"\nvalue: {value}")


def preemption(**policies: object) -> str:
    """A ClusterQueue spec's preemption block (spec lines)."""
    fields = ", ".join(f"{k}: {v}" for k, v in policies.items())
    return f"\n  preemption: {{{fields}}}"


def fair_sharing_config(*strategies: str) -> str:
    """A Configuration document turning fair sharing on, with these preemption strategies (Kueue's
    default without)."""
    listed = f"\n  preemptionStrategies: [{', '.join(strategies)}]" if strategies else ""
    return f"""
---
apiVersion: config.kueue.x-k8s.io/v1beta1
kind: Configuration
fairSharing:
  enable: true{listed}
"""
