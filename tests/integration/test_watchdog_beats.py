"""Progress beats from a Ray worker reach the driver's stall watchdog through the job's beat board:
a real Ray, a real actor in its own process, the real Watchdog. Seconds, not minutes."""

from __future__ import annotations

import time

from slime.core.errors import ExitCode
from slime.core.paths import RunPaths


class Worker:
    """Ray actor body: work that beats ``phase`` every ``every_s`` for ``seconds``, then (``hang``) stops."""

    def work(self, phase: str, seconds: float, every_s: float, hang: float = 0.0) -> int:
        from slime.diagnosis.beats import beat

        n, end = 0, time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(every_s)
            beat(phase)
            n += 1
        time.sleep(hang)
        return n


def test_a_workers_beats_keep_a_long_phase_alive_and_its_silence_is_a_stall(local_ray, tmp_path):
    from slime.runtime.watchdog import Watchdog, start_board

    ray = local_ray
    tp = RunPaths(tmp_path / "run").task(0)
    tp.dir.mkdir(parents=True)
    fired: list = []
    w = Watchdog(3.0, tp, processes=list, on_stall=fired.append, say=lambda m: None, poll_s=0.2, hard_exit=lambda: None)
    w.start(board=start_board)
    try:
        worker = ray.remote(Worker).options(num_cpus=0).remote()
        ray.get(worker.work.remote("rollout", 0.1, 0.05))  # the worker is up (its process started)
        with w.phase("checkpoint save", rollout=1, step=2):
            t0 = time.monotonic()
            assert ray.get(worker.work.remote("checkpoint save", 6.5, 0.25)) > 15  # over twice the timeout
            assert time.monotonic() - t0 >= 6.5 and not fired
            silent = time.monotonic()
            ref = worker.work.remote("checkpoint save", 0.0, 0.0, hang=60.0)
            while not fired and time.monotonic() - silent < 30:
                time.sleep(0.1)
        assert fired and time.monotonic() - silent < 3.0 + 3.0
        assert (fired[0].cause, fired[0].phase, fired[0].exit_code) == ("stall", "checkpoint save", ExitCode.STALL)
        ray.kill(worker)
        del ref
    finally:
        w.close()
