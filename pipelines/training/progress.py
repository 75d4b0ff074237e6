"""A progress bar per epoch on the driver: a thread follows RUN/progress.json (written by rank 0 every step).

In local mode and with a run directory on shared storage this shows live progress; otherwise rank 0's log lines
(streamed to the driver by TorchDistributor) are the progress.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

POLL_SECONDS = 1.0


class DriverProgress:
    """with DriverProgress(run_dir): distributor.run(...)"""

    def __init__(self, run_dir: str | Path, enabled: bool = True):
        self.path = Path(run_dir) / "progress.json"
        self.enabled = enabled
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="sparkseg-train-progress", daemon=True)

    def __enter__(self):
        if self.enabled:
            self.path.unlink(missing_ok=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _read(self) -> dict | None:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None

    def _follow(self) -> None:
        from tqdm import tqdm

        bar, epoch, last = None, None, None
        while not self._stop.wait(POLL_SECONDS):
            state = self._read()
            if state is None or state == last:
                continue
            last = state
            if state["epoch"] != epoch:
                if bar is not None:
                    bar.close()
                epoch = state["epoch"]
                bar = tqdm(
                    total=state["steps_per_epoch"],
                    desc=f"epoch {epoch + 1}/{state['epochs']}",
                    unit="step",
                    dynamic_ncols=True,
                    leave=True,
                )
            bar.n = state["step_in_epoch"]
            bar.set_postfix(loss=f"{state['loss']:.3f}", img_s=f"{state['images_per_second']:.2f}", refresh=False)
            bar.refresh()
        if bar is not None:
            state = self._read()
            if state is not None and state["epoch"] == epoch:
                bar.n = state["step_in_epoch"]
            bar.close()
