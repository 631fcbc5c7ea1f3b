#!/usr/bin/env python3
"""A planted shardlab for tools/fuzz_configs.py's own tests: every run exits 0
with a report whose figures change where the fuzzer's comparisons look, so
each mode must call the runs BAD (ctest runs them with WILL_FAIL):
  - with --no-fold, another step time and summary (fold and serve modes,
    and phantom mode, whose phantom run has --no-fold);
  - with --tp, --pp or --ep, other tokens (generate mode);
  - under mpirun, one report per process (mpi mode);
  - with --resume, other bytes in its --save file (resume mode);
  - with --resume and no --save, another loss (reshard mode);
  - collectives: a table whose auto rows are slower than --algo tree's
    (collectives mode)."""
import json
import sys

args = sys.argv[1:]
if args[:1] == ["collectives"]:
    algo = args[args.index("--algo") + 1] if "--algo" in args else "auto"
    t = 1.0 if algo == "tree" else 2.0
    print(json.dumps({"rows": [{"bytes": 8, "algo": "ring" if algo == "auto" else algo, "protocol": "LL",
                                "time_us": t, "max_error": 0.0}]}))
    sys.exit(0)
unfolded = "--no-fold" in args
sharded = any(a in args for a in ("--tp", "--pp", "--ep"))
t = 2.0 if unfolded else 1.0
if "--save" in args:
    with open(args[args.index("--save") + 1], "wb") as f:
        f.write(b"resumed" if "--resume" in args else b"straight")
print(json.dumps({
    "steps": [{"step": 0, "loss": 2.0 if "--resume" in args and "--save" not in args else 1.0,
               "virtual_time_s": t, "wall_s": 0.1}],
    "summary": {"virtual_step_s": t, "host_tokens_per_s": 1.0},
    "devices": [{"rank": 0, "compute_s": t}],
    "tokens": [1, 2] if sharded else [1, 3],
}))
