"""`gpufleet sim`'s outputs beside the text report: the progress bar's callback, the
`--plot` PNG and the `--report` directory."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from gpufleet.cli import main
from gpufleet.cli.sim_output import run_progress, run_record
from gpufleet.routing import make_policy
from gpufleet.sim import simulator as sim_module
from gpufleet.sim.report import summarize
from gpufleet.sim.scenario import Scenario, build_config, build_requests
from gpufleet.sim.simulator import FleetSimulator, Progress

PNG = b"\x89PNG\r\n\x1a\n"
SMALL = ["sim", "--rate", "20", "--num-requests", "60", "--input-tokens", "200",
         "--output-tokens", "20"]  # fmt: skip


def test_progress_is_reported_as_the_run_goes_and_once_at_the_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sim_module, "PROGRESS_EVERY_EVENTS", 200)
    sc = Scenario(rate=20.0, num_requests=120, input_tokens=200, output_tokens=30, replicas=2)
    seen: list[Progress] = []
    sim = FleetSimulator(build_config(sc), build_requests(sc), make_policy("round_robin"))
    result = sim.run(seen.append)
    assert len(seen) >= 3
    assert [p.virtual_s for p in seen] == sorted(p.virtual_s for p in seen)
    assert [p.requests_done for p in seen] == sorted(p.requests_done for p in seen)
    assert seen[0].requests_done < 120
    assert seen[-1] == Progress(result.end_s, 120, 120)


def test_no_bar_when_stderr_is_not_a_terminal() -> None:
    with run_progress(None) as callback:  # pytest captures stderr: not a terminal
        assert callback is None
    with run_progress(True) as callback:
        assert callback is not None
        callback(Progress(12.0, 3, 10))  # draws without error


def test_the_run_record_holds_every_request_and_every_fleet_change() -> None:
    sc = Scenario(rate=30.0, num_requests=90, input_tokens=2000, output_tokens=100,
                  max_num_seqs=4, autoscale="queue_depth", min_replicas=1, max_replicas=3,
                  startup_s=2.0)  # fmt: skip
    sim = FleetSimulator(build_config(sc), build_requests(sc), make_policy("round_robin"))
    result = sim.run()
    record = run_record(result, {**summarize(result), "scenario": "x"})
    assert len(record.requests) == 90 and record.title == "gpufleet sim (x)"
    assert len(record.replicas) == len(result.fleet_size)
    assert len(record.decisions) == len(result.scaling_changes) > 0


def test_plot_and_report_are_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    png, report, js = tmp_path / "run.png", tmp_path / "rep", tmp_path / "run.json"
    args = [*SMALL, "--max-num-seqs", "4", "--autoscale", "queue_depth", "--max-replicas", "3",
            "--startup-s", "2",
            "--plot", str(png), "--report", str(report), "--json", str(js)]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["gpufleet", *args])
    main()
    out = capsys.readouterr().out
    assert f"wrote {png}" in out and f"wrote {report / 'index.html'}" in out
    assert png.read_bytes().startswith(PNG)
    import matplotlib.pyplot as plt

    image = plt.imread(png)  # three pictures stacked: taller than wide
    assert image.shape[0] > image.shape[1] > 1000
    assert (report / "replicas_load.png").read_bytes().startswith(PNG)
    assert json.loads(js.read_text())["completed"] == 60


@pytest.mark.parametrize("flag", ["--plot", "--report"])
def test_a_plot_of_a_sweep_is_refused(
    flag: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [*SMALL, "--sweep", "replicas=1,2", flag, str(tmp_path / "x")]
    monkeypatch.setattr(sys, "argv", ["gpufleet", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 2
    assert flag in capsys.readouterr().err
