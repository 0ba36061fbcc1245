"""Start a real `gpufleet replica` subprocess on 127.0.0.1 (ephemeral port) for tests.

    with ReplicaProcess("--step-time", "base_s=0.002") as r:
        httpx.get(r.url + "/health")

The process prints its URL once it listens; `ReplicaProcess` waits for that line, and
`stop()` (or leaving the `with` block) terminates it, killing it if it hangs.
"""

from __future__ import annotations

import re
import subprocess
import sys
from types import TracebackType

DEFAULT_MODEL = "meta-llama/Llama-3.1-8B"
_CLI = "import sys; from gpufleet.cli import main; sys.argv[0] = 'gpufleet'; main()"


class ReplicaProcess:
    def __init__(self, *args: str, model: str = DEFAULT_MODEL, host: str = "127.0.0.1"):
        cmd = [sys.executable, "-c", _CLI, "replica", "--model", model, "--host", host]
        if "--port" not in args:
            cmd += ["--port", "0"]
        self.proc = subprocess.Popen(
            [*cmd, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # "gpufleet replica: serving M on http://H:P ..."
        match = re.search(r"http://[\w.\-]+:\d+", line)
        if match is None:
            self.stop()
            raise RuntimeError(f"replica did not start: {line!r} {self._stderr()}")
        self.url = match.group(0)
        self.port = int(self.url.rsplit(":", 1)[1])

    def _stderr(self) -> str:
        if self.proc.poll() is None or self.proc.stderr is None or self.proc.stderr.closed:
            return ""
        return self.proc.stderr.read()

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()

    def __enter__(self) -> ReplicaProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
