#!/usr/bin/env python3
"""Runs the seed router (reference/seed/kv_aware_router.py) over random operation scripts
and writes what it answered, so test/core/seed-parity.test.ts can replay the same scripts
on the TypeScript router under policy 'seed' and compare every decision and stats snapshot.

Usage: python3 scripts/gen-seed-fixture.py [--seed-file PATH] [--out PATH] [--scripts N] [--ops N] [--rng-seed N]
"""
import argparse
import asyncio
import importlib.util
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# Loads that sit on the seed's thresholds (0.8, 0.95), above 1 (clamped), exact binary
# halves (Python rounds them half to even), and ordinary values.
EDGE_LOADS = [0.0, 0.0625, 0.1875, 0.3, 0.5, 0.5625, 0.79, 0.7999999, 0.8, 0.8000001, 0.81,
              0.94, 0.9499999, 0.95, 0.9500001, 0.96, 0.9375, 1.0, 1.2, 3.5]


def load_seed(path):
    spec = importlib.util.spec_from_file_location("seed_router", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses with postponed annotations look the module up
    spec.loader.exec_module(mod)
    return mod


def decision(d):
    return {"targetWorkerId": d.target_worker_id, "anchorHash": d.anchor_hash,
            "claGroup": d.cla_group, "confidence": d.confidence, "preRope": d.pre_rope}


def stats(s):
    return {"numWorkers": s["num_workers"], "anchorsTracked": s["anchors_tracked"],
            "claAffinityEnabled": s["cla_affinity_enabled"],
            "anchorLocalityEnabled": s["anchor_locality_enabled"],
            "workerLoads": {w: {"load": v["load"], "claGroups": v["cla_groups"],
                                "activeBlocks": v["active_blocks"]}
                            for w, v in s["worker_loads"].items()}}


def random_script(rng, n_ops):
    n_workers = rng.randint(0, 6)
    workers = [f"w{i}" for i in range(n_workers + 2)]  # a few never registered up front
    anchors = [f"a{i}" for i in range(rng.randint(1, 12))]
    options = {"enableClaAffinity": rng.random() < 0.8, "enableAnchorLocality": rng.random() < 0.8}
    ops = [{"op": "register", "worker": w} for w in workers[:n_workers]]
    kinds = ["select"] * 8 + ["update"] * 5 + ["broadcast"] * 2 + ["register", "get", "stats"]
    for _ in range(n_ops):
        kind = rng.choice(kinds)
        if kind == "register":
            ops.append({"op": "register", "worker": rng.choice(workers)})
        elif kind == "select":
            op = {"op": "select", "anchor": rng.choice(anchors)}
            if rng.random() < 0.6:
                op["claGroup"] = rng.randint(0, 3)
            if rng.random() < 0.3:
                op["workflowStep"] = rng.randint(0, 5)
            if rng.random() < 0.3:
                op["tokenLength"] = rng.randint(0, 8192)
            ops.append(op)
        elif kind == "update":
            load = rng.choice(EDGE_LOADS) if rng.random() < 0.6 else round(rng.random() * 1.1, 4)
            op = {"op": "update", "worker": rng.choice(workers), "load": load}
            if rng.random() < 0.5:
                op["claGroup"] = rng.randint(0, 3)
            if rng.random() < 0.3:
                op["workflowStep"] = rng.randint(0, 5)
            ops.append(op)
        elif kind == "broadcast":
            ops.append({"op": "broadcast", "anchor": rng.choice(anchors),
                        "blockIds": [f"b{rng.randint(0, 50)}" for _ in range(rng.randint(0, 4))],
                        "worker": rng.choice(workers)})
        elif kind == "get":
            ops.append({"op": "get", "anchor": rng.choice(anchors + ["never-seen"])})
        else:
            ops.append({"op": "stats"})
    ops.append({"op": "stats"})
    return {"options": options, "ops": ops}


async def run(mod, script):
    o = script["options"]
    router = mod.KVAwareRouter(num_workers=4, enable_cla_affinity=o["enableClaAffinity"],
                               enable_anchor_locality=o["enableAnchorLocality"])
    for op in script["ops"]:
        kind = op["op"]
        if kind == "register":
            router.register_worker(op["worker"])
        elif kind == "select":
            d = await router.select_worker(op["anchor"], cla_group=op.get("claGroup"),
                                           workflow_step=op.get("workflowStep"),
                                           token_length=op.get("tokenLength", 0))
            op["expect"] = decision(d)
        elif kind == "update":
            await router.update_worker_state(op["worker"], op["load"], cla_group=op.get("claGroup"),
                                             workflow_step=op.get("workflowStep"))
        elif kind == "broadcast":
            await router.broadcast_new_blocks(op["anchor"], op["blockIds"], op["worker"])
        elif kind == "get":
            op["expect"] = router.get_worker_for_anchor(op["anchor"])
        elif kind == "stats":
            op["expect"] = stats(router.get_stats())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed-file", default=os.path.join(ROOT, "reference", "seed", "kv_aware_router.py"))
    ap.add_argument("--out", default=os.path.join(ROOT, "test", "fixtures", "seed-parity.json"))
    ap.add_argument("--scripts", type=int, default=80)
    ap.add_argument("--ops", type=int, default=60)
    ap.add_argument("--rng-seed", type=int, default=20261130)
    args = ap.parse_args()
    mod = load_seed(args.seed_file)
    rng = random.Random(args.rng_seed)
    scripts = [random_script(rng, args.ops) for _ in range(args.scripts)]
    for s in scripts:
        asyncio.run(run(mod, s))
    with open(args.out, "w") as f:
        json.dump({"generator": "scripts/gen-seed-fixture.py", "rngSeed": args.rng_seed,
                   "seedFile": "reference/seed/kv_aware_router.py", "scripts": scripts}, f,
                  separators=(",", ":"))
        f.write("\n")
    n_checks = sum(1 for s in scripts for op in s["ops"] if "expect" in op)
    print(f"wrote {args.out}: {len(scripts)} scripts, {n_checks} expected results")


if __name__ == "__main__":
    main()
