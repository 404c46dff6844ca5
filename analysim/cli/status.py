"""``analysim status``: the cluster, the queue and the clock of a running scheduler service;
``--pause``, ``--resume`` and ``--speed`` control its clock."""

from __future__ import annotations

import argparse
import json

from analysim.cli.submit import add_target, connect, refusal
from analysim.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="cluster, queue and clock of a running scheduler service",
                       description="Show a running scheduler's clock, cluster and queue; optionally pause, resume "
                                   "or change the speed of its clock first.")
    add_target(p)
    g = p.add_mutually_exclusive_group()
    g.add_argument("--pause", action="store_true", help="pause the virtual clock")
    g.add_argument("--resume", action="store_true", help="resume the virtual clock")
    g.add_argument("--speed", help="'max' (lockstep) or S virtual seconds per wall second")
    p.add_argument("--nodes", action="store_true", help="also list every node with its GPUs")
    p.add_argument("--queue", type=int, default=10, metavar="N", help="list the first N waiting jobs (default 10)")
    p.add_argument("--json", action="store_true", help="print the state as JSON")
    p.set_defaults(func=main)


def message_dict(msg) -> dict:  # noqa: ANN001 — a protobuf message
    """Every field, zero-valued ones too (MessageToDict leaves defaults out unless told)."""
    from google.protobuf.json_format import MessageToDict

    try:
        return MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    except TypeError:  # protobuf < 5.26
        return MessageToDict(msg, preserving_proto_field_name=True, including_default_value_fields=True)


def main(args: argparse.Namespace) -> int:
    import grpc

    from scheduler_svc.cli import parse_speed

    with connect(args) as c:
        try:
            if args.pause:
                c.pause()
            elif args.resume:
                c.resume()
            elif args.speed:
                try:
                    c.set_speed(parse_speed(args.speed))
                except argparse.ArgumentTypeError as e:
                    raise UserError(str(e)) from None
            st = c.cluster_state(nodes=args.nodes, queue_limit=args.queue)
        except grpc.RpcError as e:
            raise UserError(f"{args.scheduler}: {refusal(e)}") from None
    if args.json:
        print(json.dumps(message_dict(st), indent=2))
        return 0
    ck = st.clock
    mode = "lockstep" if ck.lockstep else f"paced x{ck.speed:g}"
    state = "paused" if ck.paused else ("running" if ck.started else "waiting for agents")
    print(f"clock    t={ck.time_s:.1f} s ({ck.time_s / 86400:.2f} d), {mode}, {state}"
          + (f", x{ck.speed:,.0f} achieved" if ck.lockstep and ck.started else ""))
    print(f"cluster  {st.policy}: {st.gpus_allocated:g}/{st.gpus_total} GPUs allocated, nodes {st.nodes_up} up "
          f"{st.nodes_down} down, {st.agents} agent(s)")
    print(f"jobs     {st.jobs_submitted} submitted: {st.jobs_pending} pending ({st.pending_gpu_demand:g} GPUs), "
          f"{st.jobs_running} running, {st.jobs_completed} completed, {st.jobs_failed} failed, "
          f"{st.jobs_cancelled} cancelled" + ("; replay done" if st.replay_done else ""))
    if st.queue:
        print("queue    " + "  ".join(f"{j.job_id}({j.num_gpus}g {j.vc})" for j in st.queue))
    for n in st.nodes:
        gpus = " ".join(f"{g.allocated:.1f}/{g.utilization:.0%}" for g in n.gpu)
        print(f"  {n.name} {n.gpu_model} {'up' if n.up else 'DOWN'} {n.agent_id or '-'}  {gpus}")
    return 0
