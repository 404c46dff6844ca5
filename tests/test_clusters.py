"""Cluster specs: presets, NxG shorthand, JSON/YAML/TOML files and openb node lists."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from analysim.clusters import (
    CPU_MILLI_PER_GPU,
    MEMORY_MIB_PER_GPU,
    OPENB_NODE_CLASSES,
    PHILLY_VC_GPU_TIME_SHARE,
    list_presets,
    parse_cluster,
    proportional_quotas,
)
from analysim.core.cluster import ClusterSpec, ClusterState, NodeSpec
from analysim.core.job import GPU_MILLI
from analysim.errors import InputFileError, UserError
from analysim.traces import synthetic
from tests.shared import TRACES, needs_shared

DATA = Path(__file__).resolve().parent / "data"


@pytest.mark.parametrize(
    ("name", "nodes", "gpus", "racks"),
    [
        ("philly", 64, 512, 4),
        ("helios-venus", 135, 1080, 9),
        ("openb", 1213, 6212, 76),
        ("demo", 16, 128, 4),
        ("tiny", 4, 32, 1),
    ],
)
def test_presets_sizes(name, nodes, gpus, racks):
    c = parse_cluster(name)
    assert (len(c.nodes), c.total_gpus, len(c.racks)) == (nodes, gpus, racks)
    assert c.description and name in list_presets()
    ClusterState(c)  # the engine's state accepts it
    assert len({n.name for n in c.nodes}) == nodes


def test_list_presets_names():
    assert list(list_presets()) == ["philly", "helios-venus", "openb", "demo", "tiny"]


def test_philly_and_demo_vcs_cover_the_synthetic_trace():
    for name, total in (("philly", 512), ("demo", 128)):
        c = parse_cluster(name)
        assert {v.name for v in c.vcs} == set(synthetic.VCS)
        assert sum(v.quota_gpus for v in c.vcs) == total
        assert min(v.quota_gpus for v in c.vcs) >= 1
    quotas = {v.name: v.quota_gpus for v in parse_cluster("philly").vcs}
    assert quotas["ee9e8c"] == 131 and quotas["7f04ca"] == 85  # 26.2% and 16.9% of the GPU-time


def test_v100_nodes_are_dgx1_like():
    n = parse_cluster("philly").nodes[0]
    assert (n.gpu_model, n.gpus, n.cpu_milli, n.memory_mib) == ("V100", 8, 80_000, 512 * 1024)
    assert 8 * CPU_MILLI_PER_GPU == 80_000 and 8 * MEMORY_MIB_PER_GPU == 524_288


def test_openb_preset_classes():
    c = parse_cluster("openb")
    assert [n.name for n in c.nodes[:2]] == ["openb-node-0000", "openb-node-0001"]
    assert c.nodes[0].gpu_model == "G2" and c.nodes[-1].gpu_model == "V100M16"
    assert sum(count for _, count in OPENB_NODE_CLASSES) == 1213


@needs_shared(TRACES / "openb_node_list_gpu_node.csv")
def test_openb_preset_matches_real_node_list():
    path = TRACES / "openb_node_list_gpu_node.csv"
    real, preset = parse_cluster(str(path)), parse_cluster("openb")
    assert (len(real.nodes), real.total_gpus) == (1213, 6212)

    def classes(c):
        return Counter((n.cpu_milli, n.memory_mib, n.gpus, n.gpu_model) for n in c.nodes)

    assert classes(real) == classes(preset)


def test_proportional_quotas():
    q = proportional_quotas(PHILLY_VC_GPU_TIME_SHARE, 512)
    assert sum(q.values()) == 512 and min(q.values()) == 1
    assert proportional_quotas([("a", 1.0), ("b", 1.0), ("c", 1.0)], 10, floor=0) == {"a": 4, "b": 3, "c": 3}
    with pytest.raises(ValueError):
        proportional_quotas([("a", 1.0), ("b", 1.0)], 1)


# --- shorthand -------------------------------------------------------------------------------------


def test_shorthand():
    c = parse_cluster("40x4:T4")
    assert (len(c.nodes), c.total_gpus, c.gpu_models) == (40, 160, ("T4",))
    assert len(c.racks) == 3 and c.vcs == ()  # racks of 16
    assert c.nodes[0].cpu_milli == 4 * CPU_MILLI_PER_GPU
    assert parse_cluster("2x8").gpu_models == ("V100",)


@pytest.mark.parametrize("spec", ["0x8", "4x0", "4x8:", "4*8", "philly2", "x8"])
def test_bad_specs(spec):
    with pytest.raises(UserError):
        parse_cluster(spec)


def test_unknown_spec_message_lists_options():
    with pytest.raises(UserError, match=r"not a preset \(philly, helios-venus, openb, demo, tiny\)"):
        parse_cluster("nope")


# --- files -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["cluster.yaml", "cluster.json", "cluster.toml"])
def test_spec_files(name):
    c = parse_cluster(str(DATA / name))
    assert (c.name, len(c.nodes), c.total_gpus) == ("lab", 24, 176)
    assert c.racks == ("rack-00", "rack-01", "edge")
    assert (c.allow_borrowing, c.cross_node_slowdown, c.cross_rack_slowdown) == (False, 0.1, 0.25)
    vcs = {v.name: v for v in c.vcs}
    assert vcs["research"].quota_gpus == 96.0 and vcs["research"].nodes == ()
    assert vcs["prod"].nodes == ("node-0000", "node-0001") and vcs["prod"].quota_gpus is None
    assert vcs["inference"].nodes == ("t4-0000", "t4-0001")
    t4 = c.nodes[-1]
    assert (t4.name, t4.gpu_model, t4.cpu_milli, t4.memory_mib) == ("t4-0003", "T4", 32000, 131072)
    ClusterState(c)


def test_spec_file_defaults(tmp_path):
    p = tmp_path / "mini.json"
    p.write_text(json.dumps({"nodes": [{"count": 2, "gpus": 4}, {"count": 1, "gpus": 2}]}))
    c = parse_cluster(str(p))
    assert c.name == "mini" and c.allow_borrowing and c.gpu_models == ("V100",)
    assert [n.name for n in c.nodes] == ["node-0000", "node-0001", "node-0002"]  # numbering continues
    assert c.racks == ("rack-00", "rack-01")  # a group starts a new rack
    assert c.nodes[1].cpu_milli == 4 * CPU_MILLI_PER_GPU


BASE = {"nodes": [{"count": 4, "gpus": 8}]}


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({}, "nodes", "missing"),
        ({"nodes": []}, "nodes", "non-empty list"),
        ({"nodes": [{"gpus": 8}]}, "nodes[0].count", "missing"),
        ({"nodes": [{"count": 2, "gpus": "8"}]}, "nodes[0].gpus", "whole number"),
        ({"nodes": [{"count": 2, "gpus": 8.5}]}, "nodes[0].gpus", "whole number"),
        ({"nodes": [{"count": 0, "gpus": 8}]}, "nodes[0].count", "at least 1"),
        ({"nodes": [{"count": 1, "gpus": 8, "gpu": 2}]}, "nodes[0]", "unknown field(s) gpu"),
        ({"nodes": [{"count": 1, "gpus": 8, "rack": "a", "rack_size": 2}]}, "nodes[0]", "not both"),
        ({**BASE, "vcs": [{"quota_gpus": 3}]}, "vcs[0].name", "missing"),
        ({**BASE, "vcs": [{"name": "a"}, {"name": "a"}]}, "vcs[1].name", "duplicate"),
        ({**BASE, "vcs": [{"name": "a", "quota_gpus": -1}]}, "vcs[0].quota_gpus", ">= 0"),
        (
            {**BASE, "vcs": [{"name": "a", "quota_gpus": 30}, {"name": "b", "quota_gpus": 3}]},
            "vcs",
            "more than",
        ),
        ({**BASE, "vcs": [{"name": "a", "nodes": 5}]}, "vcs[0].nodes", "only 4"),
        ({**BASE, "vcs": [{"name": "a", "nodes": ["node-0009"]}]}, "vcs[0].nodes[0]", "no node named"),
        (
            {**BASE, "vcs": [{"name": "a", "nodes": 1}, {"name": "b", "nodes": ["node-0000"]}]},
            "vcs[1].nodes[0]",
            "already",
        ),
        ({**BASE, "vcs": [{"name": "a", "nodes": "all"}]}, "vcs[0].nodes", "node count or a list"),
        ({**BASE, "vcs": {"name": "a"}}, "vcs", "list"),
        ({**BASE, "allow_borrowing": "yes"}, "allow_borrowing", "true or false"),
        ({**BASE, "cross_rack_slowdown": "0.2"}, "cross_rack_slowdown", "finite number"),
        ({**BASE, "racks": 3}, "top level", "unknown field(s) racks"),
    ],
)
def test_spec_file_errors_name_file_and_field(tmp_path, spec, field, words):
    p = tmp_path / "c.json"
    p.write_text(json.dumps(spec))
    with pytest.raises(UserError) as e:
        parse_cluster(str(p))
    assert str(e.value).startswith(f"{p}: {field}: ") and words in str(e.value)


@pytest.mark.parametrize(
    ("name", "text", "line"),
    [
        ("c.json", '{"nodes": [\n  {"count": 2,, "gpus": 8}]}', 2),
        ("c.yaml", "nodes:\n  - {count: 2, gpus: 8\nvcs: []\n", 3),
        ("c.toml", "[[nodes]]\ncount = = 2\n", None),
    ],
)
def test_unparsable_files(tmp_path, name, text, line):
    p = tmp_path / name
    p.write_text(text)
    with pytest.raises(InputFileError) as e:
        parse_cluster(str(p))
    assert e.value.line == line and str(e.value).startswith(str(p))


def test_empty_yaml_and_unknown_suffix(tmp_path):
    (tmp_path / "e.yaml").write_text("")
    with pytest.raises(UserError, match="top level: expected a mapping"):
        parse_cluster(str(tmp_path / "e.yaml"))
    (tmp_path / "c.ini").write_text("x")
    with pytest.raises(UserError, match="unknown cluster file type"):
        parse_cluster(str(tmp_path / "c.ini"))


# --- openb node lists ------------------------------------------------------------------------------


def test_node_list_skips_gpuless_nodes_with_a_count():
    c = parse_cluster(str(DATA / "openb_nodes_small.csv"))
    assert [n.name for n in c.nodes] == ["openb-node-0000", "openb-node-0001", "openb-node-0003"]
    assert c.total_gpus == 12 and "left out 1 nodes without GPUs" in c.description
    assert c.nodes[1].cpu_milli == 96000 and c.nodes[1].gpu_model == "G2"


@pytest.mark.parametrize(
    ("row", "column"),
    [("n9,64000,262144,two,P100", "gpu"), ("n9,64000,-1,2,P100", "memory_mib"), ("n9,64000,262144,2,", "model"),
     ("openb-node-0000,64000,262144,2,P100", "sn")],
)  # fmt: skip
def test_node_list_errors(tmp_path, row, column):
    p = tmp_path / "nodes.csv"
    p.write_text("sn,cpu_milli,memory_mib,gpu,model\nopenb-node-0000,64000,262144,2,P100\n" + row + "\n")
    with pytest.raises(InputFileError) as e:
        parse_cluster(str(p))
    assert (e.value.line, e.value.column) == (3, column)


@settings(max_examples=60, deadline=None)
@given(
    gpus=st.lists(st.sampled_from([1, 2, 8, 64]), min_size=1, max_size=4),
    ops=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 63), st.integers(0, 2), st.integers(1, 20)), max_size=120),
)
# (the most free goes from the node that had it, 8, to another node's 6, not to its own 4)
@example(gpus=[8, 8], ops=[(1, 0, 0, 2), (0, 0, 0, 4)])
def test_max_full_free_follows_every_allocation_release_and_failure(gpus, ops):
    """The kept maximum (and total) equals a scan of the arrays after any mix of whole-GPU allocations
    and releases of one GPU or several, and nodes going down and up (a down node's free GPUs do not
    count)."""
    state = ClusterState(ClusterSpec("h", tuple(NodeSpec(f"n{i}", "r", "V100", g, 1, 1) for i, g in enumerate(gpus))))
    for node, slot, op, width in ops:
        node %= len(gpus)
        slot %= gpus[node]
        slots = tuple(range(slot, min(slot + width, gpus[node])))
        if op == 2:
            state.set_up(node, not state.up[node])
        elif op == 0 and all(state.free_milli[node, g] == GPU_MILLI for g in slots):
            state.allocate(node, slots, GPU_MILLI, 0, 0)
        elif op == 1 and all(state.free_milli[node, g] == 0 for g in slots):
            state.release(node, slots, GPU_MILLI, 0, 0)
        assert state.full_free.tolist() == [int((state.free_milli[n, :g] == GPU_MILLI).sum()) for n, g in enumerate(gpus)]
        assert state.free_total.tolist() == [int(state.free_milli[n, :g].sum()) for n, g in enumerate(gpus)]
        expected = int(state.full_free[state.up].max()) if state.up.any() else 0
        assert state.max_full_free() == expected
        assert state.total_full_free == int(state.full_free[state.up].sum())


@pytest.mark.parametrize("slots", [(0, 1, 2), (2, 3), (3, 3)])
def test_a_whole_gpu_allocation_onto_a_taken_or_repeated_gpu_is_refused(slots):
    """A whole-GPU job's GPUs must each be wholly free, and each given once: GPU 2 holds a share of
    another job's, GPU 3 is asked for twice."""
    state = ClusterState(ClusterSpec("h", (NodeSpec("n0", "r", "V100", 8, 1, 1),)))
    state.allocate(0, (2,), 500, 0, 0)
    with pytest.raises(AssertionError, match="over-allocated"):
        state.allocate(0, slots, GPU_MILLI, 0, 0)
