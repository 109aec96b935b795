"""The local Cloud Scheduler: a thread that publishes a tick every interval."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from spotorch_trainer.contract import rfc3339


def now_rfc3339() -> str:
    return rfc3339(time.time())


class Ticker:
    """Publishes {"time": RFC3339} to the tick topic every interval (Cloud Scheduler, locally)."""

    def __init__(self, publish: Callable[[], str], interval_s: float, log_path: Path) -> None:
        self._publish = publish
        self.interval_s = interval_s
        self.log_path = log_path
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spotorch-ticker", daemon=True)
        self.count = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        with self.log_path.open("a") as log:
            while not self._stop.wait(self.interval_s):
                try:
                    message_id = self._publish()
                    self.count += 1
                    log.write(f"{now_rfc3339()} tick {message_id}\n")
                except Exception as exc:  # keep ticking: the emulator may be restarting
                    log.write(f"{now_rfc3339()} tick failed: {exc!r}\n")
                log.flush()


