#!/usr/bin/env python3
"""Learning-rate multipliers from transformers' get_scheduler, for llmt's schedule test.

Writes tests/reference/schedules.json: for each case (scheduler type, total steps, warmup steps, base
rate, the schedule's keyword arguments), the learning rate of every optimizer step 0..total+2 as a
multiple of the base rate (LambdaLR's lr_lambda(step)), read off a real torch optimizer driven by the
real scheduler.

  pip install torch transformers && python3 tests/reference/make_schedule_fixtures.py
"""
import json
import os

import torch
from transformers import get_scheduler

# (type, total steps, warmup steps, base lr, scheduler_specific_kwargs: --lr_scheduler_kwargs)
CASES = [("linear", 100, 7, 1.0, {}), ("cosine", 100, 7, 1.0, {}), ("constant", 20, 0, 1.0, {}),
         ("constant_with_warmup", 30, 5, 1.0, {}), ("linear", 10, 0, 1.0, {}), ("cosine", 13, 3, 1.0, {}),
         ("cosine", 1, 0, 1.0, {}), ("linear", 5, 10, 1.0, {}),
         ("cosine", 40, 4, 1.0, {"num_cycles": 1.5}), ("cosine_with_restarts", 50, 5, 1.0, {}),
         ("cosine_with_restarts", 50, 5, 1.0, {"num_cycles": 3}), ("polynomial", 30, 3, 3e-4, {}),
         ("polynomial", 30, 3, 3e-4, {"lr_end": 1e-5, "power": 2.0}), ("polynomial", 12, 0, 1.0, {"power": 0.5})]


def multipliers(kind, total, warmup, base_lr, kwargs):
    """The rate of every optimizer step 0..total+2 (past the end too), over base_lr."""
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=base_lr)
    sched = get_scheduler(kind, opt, num_warmup_steps=warmup, num_training_steps=total,
                          scheduler_specific_kwargs=kwargs)
    out = []
    for _ in range(total + 3):
        out.append(opt.param_groups[0]["lr"] / base_lr)
        opt.step()
        sched.step()
    return out


def main():
    cases = [{"type": k, "total": t, "warmup": w, "base_lr": lr, "kwargs": kw, "lr": multipliers(k, t, w, lr, kw)}
             for k, t, w, lr, kw in CASES]
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schedules.json")
    with open(path, "w") as f:
        json.dump(cases, f, indent=1)
    print(f"wrote {path}: {len(cases)} cases")


if __name__ == "__main__":
    main()
