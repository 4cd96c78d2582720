#!/usr/bin/env python3
"""Transient memory of one PyTorch training step, the peer's side of frugal's arena.

frugal's arena holds everything a step allocates beyond parameters and
optimizer state: activations, their gradients, parameter gradients, scratch.
The peer's README reports only what autograd saves during the forward
(`activation_mib`), which leaves out what a checkpointed block re-creates
during the backward and every gradient. This replays one warm step of the
peer's own workload (../shared/peer/torch_bench.py, same shapes and seeds)
under the PyTorch profiler with memory recording, orders every CPU
allocation and free by time, and reports the highest running total above
the step's start: the bytes the step needs on top of what persists.

Usage: bench/peer-step-memory --workload gpt [--checkpoint]
Prints 'RESULT {json}' with peak_step_mib (and the run's own loss).
"""
import argparse
import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "shared", "peer"))
import torch  # noqa: E402
import torch_bench  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402
from torch._C._profiler import _EventType  # noqa: E402


def allocations(prof):
    """(time ns, signed bytes) of every allocation and free the profiler saw."""
    out = []

    def walk(n):
        if n.tag == _EventType.Allocation:
            out.append((n.start_time_ns, n.extra_fields.alloc_size))
        for c in n.children:
            walk(c)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    return sorted(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", required=True, choices=sorted(torch_bench.MAKERS))
    ap.add_argument("--checkpoint", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    model, inputs, target, loss_fn, opt, _, _ = torch_bench.MAKERS[args.workload](args, g)
    model.train()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(*inputs), target)
        loss.backward()
        opt.step()
        return loss.item()

    step()  # the optimizer allocates its state in its first step: that persists, like frugal's
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss = step()
    running = peak = 0
    for _, b in allocations(prof):
        running += b
        peak = max(peak, running)
    print("RESULT " + json.dumps({"workload": args.workload, "checkpoint": args.checkpoint,
                                  "peak_step_mib": peak / 2**20, "end_step_mib": running / 2**20,
                                  "loss": loss}), flush=True)


if __name__ == "__main__":
    main()
