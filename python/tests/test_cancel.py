"""SIGINT during a run ends it, every thread joined, within a second."""
import os
import signal
import subprocess
import sys
import textwrap

# The child: a long run; the SIGINT handler notes when the signal came, and
# the except block how long the run took to end after it.
CHILD = textwrap.dedent("""
    import signal, sys, threading, time
    import shardlab
    got = []
    def on_sigint(signum, frame):
        got.append(time.monotonic())
        raise KeyboardInterrupt
    signal.signal(signal.SIGINT, on_sigint)
    print("started", flush=True)
    try:
        shardlab.{call}
        print("finished without interruption", flush=True)
        sys.exit(1)
    except KeyboardInterrupt:
        ended = time.monotonic()
    print(f"ended {{ended - got[0]:.3f}} s after SIGINT; threads {{threading.active_count()}}", flush=True)
    r = shardlab.train(model="tiny", steps=1)  # the cancel flag is cleared: the next run runs
    print("next run", len(r.steps), flush=True)
""")


def interrupt(call):
    env = dict(os.environ)
    p = subprocess.Popen([sys.executable, "-c", CHILD.format(call=call)], stdout=subprocess.PIPE, text=True, env=env)
    assert p.stdout.readline().strip() == "started"
    # Let the run get going (the child cannot tell us when its threads start).
    try:
        p.wait(timeout=1.5)
    except subprocess.TimeoutExpired:
        pass
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=60)
    return p.returncode, out


def check(code, out):
    assert code == 0, out
    first = out.splitlines()[0]
    assert first.startswith("ended "), out
    seconds = float(first.split()[1])
    print(f"cancellation latency {seconds:.3f} s (bound 1 s)")
    assert seconds < 1.0
    assert "threads 1" in first  # no Python thread left behind
    assert "next run 1" in out


def test_sigint_ends_a_training_run():
    check(*interrupt('train(model="tiny", steps=100000, dp=2)'))


def test_sigint_ends_a_python_cluster_program():
    call = 'Cluster(devices=2).run(lambda dev: [dev.compute(flops=1e9) for _ in range(10**9)])'
    check(*interrupt(call))


def test_sigint_ends_a_device_function_that_never_calls_into_its_device():
    # A pure Python loop: no receive to wake, no device call to check the
    # cancel flag; RunAborted is raised in its thread (python/run_thread.h).
    check(*interrupt('Cluster(devices=2).run(lambda dev: all(True for _ in iter(int, 1)))'))
