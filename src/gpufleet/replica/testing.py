"""Start a real `gpufleet replica` subprocess on 127.0.0.1 (ephemeral port) for tests.

    with ReplicaProcess("--step-time", "base_s=0.002") as r:
        httpx.get(r.url + "/health")

The process prints its URL once it listens; `ReplicaProcess` waits for that line, and
`stop()` (or leaving the `with` block) terminates it, killing it if it hangs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from types import TracebackType

DEFAULT_MODEL = "meta-llama/Llama-3.1-8B"
_CLI = "import sys; from gpufleet.cli import main; sys.argv[0] = 'gpufleet'; main()"


class ReplicaProcess:
    def __init__(
        self,
        *args: str,
        model: str = DEFAULT_MODEL,
        host: str = "127.0.0.1",
        env: dict[str, str] | None = None,
    ):
        cmd = [sys.executable, "-c", _CLI, "replica", "--model", model, "--host", host]
        if "--port" not in args:
            cmd += ["--port", "0"]
        # stderr goes to a file: an unread pipe would fill up and block the replica.
        self._stderr_file = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as self)
        self.proc = subprocess.Popen(
            [*cmd, *args],
            stdout=subprocess.PIPE,
            stderr=self._stderr_file,
            text=True,
            env={**os.environ, **env} if env else None,  # e.g. VLLM_ALLOW_RUNTIME_LORA_UPDATING
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # "gpufleet replica: serving M on http://H:P ..."
        match = re.search(r"http://[\w.\-]+:\d+", line)
        if match is None:
            self.stop()
            raise RuntimeError(f"replica did not start: {line!r} {self.stderr_text()}")
        self.url = match.group(0)
        self.port = int(self.url.rsplit(":", 1)[1])

    def stderr_text(self) -> str:
        """Everything the replica wrote to stderr so far (its access log with --access-log)."""
        if self._stderr_file.closed:
            return ""
        self._stderr_file.seek(0)
        return self._stderr_file.read().decode(errors="replace")

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def close(self) -> None:
        """Stop the process and drop its captured stderr."""
        self.stop()
        self._stderr_file.close()

    def __enter__(self) -> ReplicaProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
