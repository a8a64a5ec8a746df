"""torch's thread count beside the server's own threads: ``lmi serve`` with default options under each
``OMP_NUM_THREADS``, and with it unset (``default``: lmi's own policy), one server at a time, on
``serve_sweep.py``'s unique-prompt workload.

    .venv/bin/python benchmarks/threads.py                               # default, 1 and every CPU; C = 1, 16, 64
    .venv/bin/python benchmarks/threads.py --threads default,1,2 --concurrency 1,16 --model random-115m

A server process runs more than torch's workers: the HTTP front end, tokenizing and detokenizing, the step loop
that builds each step's inputs. With as many torch threads as CPUs they preempt a torch worker in the middle of a
product, and the product waits for its slowest thread; with one CPU fewer they have one of their own, and the
products one CPU less. Which is faster is a measurement on the machine at hand, so this script measures it: what
``lmi serve`` sets where ``OMP_NUM_THREADS`` is unset (``lmi_handlers/backends/hf/cpu/kernels.py``,
``step_threads``: every CPU, in both of DJL's modes) comes from here.

Prints output tokens/s and TTFT p50 per thread count and concurrency, and the load average before and after (on a
shared machine the figures move with it). Figures, not assertions. Results also go to ``out/threads.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.serve_sweep import MODELS, OUT, NotRun, lmi_command, ms, prompts_for, running, sweep  # noqa: E402
from lmi_tools.bench.local_server import free_port  # noqa: E402
from lmi_tools.bench.prompts import TokenCounter  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default=f"default,1,{os.cpu_count() or 1}",
                        help="OMP_NUM_THREADS values to compare; default: unset, lmi's own policy")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--model", choices=sorted(MODELS), default="smollm2-unique")
    parser.add_argument("--lmi-option", action="append", default=[], metavar="KEY=VALUE",
                        help="one more option.KEY=VALUE in serving.properties (default: none, the defaults)")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    model = MODELS[args.model]()
    counter = TokenCounter.load(model.path)
    prompts = prompts_for(model, counter)
    workdir = OUT / "threads"
    workdir.mkdir(parents=True, exist_ok=True)
    report = {"load": os.getloadavg(), "cpus": os.cpu_count(), "model": model.name, "runs": {}}
    os.environ.pop("OMP_NUM_THREADS", None)  # each server gets its own below; "default" leaves it unset
    for threads in args.threads.split(","):
        print(f"OMP_NUM_THREADS={threads}", flush=True)
        port = free_port()
        argv, env, ready = lmi_command(model, port, workdir, args.lmi_option)
        if threads != "default":
            env = {**env, "OMP_NUM_THREADS": threads}
        try:
            with running(argv, env, ready, port, workdir / f"lmi-{threads}.log") as base:
                report["runs"][threads] = sweep(base, model, prompts, counter, levels, args.requests_per_client,
                                                ignore_eos=model.ignore_eos)
        except NotRun as exc:
            print(f"  not run: {exc}", flush=True)
            report["runs"][threads] = []
    report["load_after"] = os.getloadavg()
    print(f"\n{model.name}, lmi serve {' '.join(args.lmi_option) or 'with default options'}: output tokens/s "
          "(TTFT p50, ms) by OMP_NUM_THREADS\n| threads | " + " | ".join(f"C={c}" for c in levels) + " |\n|---|"
          + "---|" * len(levels))
    for threads, rows in report["runs"].items():
        cells = [f"{row['output_tokens_per_s'] or 0:.1f} ({ms(row['ttft_p50'])})" for row in rows]
        print(f"| {threads} | " + " | ".join(cells or ["not run"]) + " |")
    print(f"load average before/after: {report['load']} / {report['load_after']} on {report['cpus']} CPUs")
    (OUT / "threads.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
