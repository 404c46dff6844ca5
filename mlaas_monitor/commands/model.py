"""``analysim model train|list|show``: train decision trees into the gateway's store."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from analysim.argtypes import positive_int
from analysim.dataset_args import add_dataset_arguments, table_options
from analysim.errors import UserError

if TYPE_CHECKING:
    from mlaas_monitor.store import Store

MODEL_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")



def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("model", help="train, list and show the models the MLaaS gateway serves")
    msub = p.add_subparsers(dest="model_command", metavar="ACTION", required=True)

    t = msub.add_parser("train", help="train a decision tree and register it in the store")
    t.add_argument("--db", required=True, help="the store: a SQLite file (created if absent) or a postgresql:// URL")
    t.add_argument("--dataset", required=True, help="iris, wine, breast_cancer, digits, or a CSV / german.data file")
    t.add_argument("--target", help="target column of a file (default: credit, income, else the last column)")
    t.add_argument("--max-depth", type=positive_int)
    t.add_argument("--max-leaf-nodes", type=positive_int)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--name", required=True, help="model id")
    t.add_argument("--replace", action="store_true", help="overwrite a model with the same id")
    t.add_argument("--price", type=float, default=0.001, help="credits per answered row (default 0.001)")
    t.add_argument("--decimals", type=int, default=2, help="confidence rounding (default 2)")
    t.add_argument("--no-confidence", action="store_true", help="reveal the label only")
    t.add_argument("--reveal-leaf", action="store_true", help="also reveal the leaf id")
    t.add_argument("--top-k", type=int, default=1,
                   help="reveal the k most probable classes' confidences, ranked (default 1: the label's)")
    t.add_argument("--confidence-noise", type=float, default=0.0,
                   help="standard deviation of Gaussian noise on confidences (default 0: none)")
    t.add_argument("--noise-seed", type=int, default=0, help="seed of that noise (the same row, the same answer)")
    add_dataset_arguments(t)
    t.set_defaults(func=_train)

    ls = msub.add_parser("list", help="list registered models")
    ls.add_argument("--db", required=True)
    ls.set_defaults(func=_list)

    sh = msub.add_parser("show", help="print a model's schema, card and policy as JSON")
    sh.add_argument("--db", required=True)
    sh.add_argument("id")
    sh.set_defaults(func=_show)


def _open(path: str, must_exist: bool = True) -> Store:
    # Imported here: `analysim --help` must not pay for numpy and the store.
    from mlaas_monitor.store import Store
    from mlaas_monitor.store_backends import is_postgres_url

    if must_exist and not is_postgres_url(path) and not Path(path).is_file():
        raise UserError(f"no store at {path}")
    return Store(path)


def _train(args: argparse.Namespace) -> int:
    from mlaas_monitor.datasets import load_dataset
    from mlaas_monitor.model import Policy, PolicyError
    from mlaas_monitor.training import train_model

    if not MODEL_ID.fullmatch(args.name):
        raise UserError("--name: expected 1-64 characters: letters, digits, '_', '.', '-'")
    try:
        policy = Policy().updated(
            {"price": args.price, "confidence_decimals": args.decimals,
             "reveal_confidence": not args.no_confidence, "reveal_leaf": args.reveal_leaf, "top_k": args.top_k,
             "confidence_noise": args.confidence_noise, "noise_seed": args.noise_seed}
        )  # fmt: skip
    except PolicyError as e:
        raise UserError(f"--{e.field.replace('_', '-')}: {e.problem}") from e
    ds = load_dataset(args.dataset, args.target, table_options(args))
    for note in ds.notes:
        print(f"{args.dataset}: {note}", file=sys.stderr)
    model = train_model(ds, args.name, args.max_depth, args.max_leaf_nodes, args.seed, policy)
    store = _open(args.db, must_exist=False)
    try:
        store.add_model(model, replace=args.replace)
    finally:
        store.close()
    c = model.card
    print(
        f"model {model.id}: {c['leaves']} leaves, depth {c['depth']}, {len(model.schema)} features, "
        f"{len(model.classes)} classes, held-out accuracy {c['validation_accuracy']:.4f} "
        f"({c['training_rows']} train / {c['validation_rows']} held out) -> {args.db}"
    )
    return 0


def _list(args: argparse.Namespace) -> int:
    from mlaas_monitor.store_records import ModelUnavailable

    store = _open(args.db)
    try:
        ids = store.model_ids()
        print(f"{'ID':<24} {'DATASET':<26} {'FEATURES':>8} {'CLASSES':>7} {'LEAVES':>6} {'DEPTH':>5} {'ACCURACY':>8} {'PRICE':>8}")
        for mid in ids:
            try:
                m = store.load_model(mid)
            except ModelUnavailable as e:
                print(f"{mid:<24} unavailable: {e.reason}")
                continue
            assert m is not None
            c = m.card
            print(
                f"{mid:<24} {str(c['dataset'])[:26]:<26} {len(m.schema):>8} {len(m.classes):>7} {c['leaves']:>6} "
                f"{c['depth']:>5} {c['validation_accuracy']:>8.4f} {m.policy.to_dict()['price']:>8g}"
            )
    finally:
        store.close()
    return 0


def _show(args: argparse.Namespace) -> int:
    from mlaas_monitor.store_records import ModelUnavailable

    store = _open(args.db)
    try:
        m = store.load_model(args.id)
    except ModelUnavailable as e:
        raise UserError(f"{args.db}: {e}") from e
    finally:
        store.close()
    if m is None:
        raise UserError(f"no model {args.id!r} in {args.db}")
    print(json.dumps(m.public(), indent=2))
    return 0
