#!/usr/bin/env python3
"""Learning-rate multipliers from transformers' get_scheduler, for llmt's schedule test.

Writes tests/reference/schedules.json: for each case (scheduler type, total steps, warmup steps),
the learning rate of every optimizer step 0..total as a multiple of the base rate (LambdaLR's
lr_lambda(step)), read off a real torch optimizer driven by the real scheduler.

  pip install torch transformers && python3 tests/reference/make_schedule_fixtures.py
"""
import json
import os

import torch
from transformers import get_scheduler

CASES = [("linear", 100, 7), ("cosine", 100, 7), ("constant", 20, 0), ("constant_with_warmup", 30, 5),
         ("linear", 10, 0), ("cosine", 13, 3), ("cosine", 1, 0), ("linear", 5, 10)]


def multipliers(kind, total, warmup):
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=1.0)
    sched = get_scheduler(kind, opt, num_warmup_steps=warmup, num_training_steps=total)
    out = []
    for _ in range(total + 1):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def main():
    cases = [{"type": k, "total": t, "warmup": w, "lr": multipliers(k, t, w)} for k, t, w in CASES]
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schedules.json")
    with open(path, "w") as f:
        json.dump(cases, f, indent=1)
    print(f"wrote {path}: {len(cases)} cases")


if __name__ == "__main__":
    main()
