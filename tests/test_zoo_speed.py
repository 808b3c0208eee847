"""benchmarks/zoo_speed.py's --processes (no GPU needed): each model timed in fresh processes, their rows gathered
with the process's number and the children's header, a failed process kept as a row with its error, the JSON
written after each process, and the table of per-process ratios with their median."""

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import zoo_speed  # noqa: E402


def _args(processes):
    return SimpleNamespace(batch=128, size=224, dtype="bfloat16", warmup=3, repeats=10, calls=3, processes=processes)


def test_each_model_runs_in_its_own_processes_and_a_failed_one_is_a_row(monkeypatch):
    calls = []

    def fake_run(command, capture_output, text):
        calls.append(command)
        model, path = command[command.index("--models") + 1], command[command.index("--json") + 1]
        if len(calls) == 2:  # the second process dies before it writes its JSON
            return subprocess.CompletedProcess(command, 1, "", "Traceback ...\nRuntimeError: out of memory")
        eager = 10.0 + len(calls)
        row = {"model": model, "train": {"eager": eager, "fused": 9.0}, "inference": {"eager": 4.0, "fused": 3.0},
               "train_samples": {"eager": [eager] * 3, "fused": [9.0] * 3}}
        with open(path, "w") as f:
            json.dump({"gpu": "GPU X", "torch": "2.11", "rows": [row]}, f)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(zoo_speed.subprocess, "run", fake_run)
    rows = zoo_speed.run_in_processes(["torchvision:a", "timm:b"], _args(2))
    assert len(calls) == 4 and all(c[0] == sys.executable and "--processes" not in c for c in calls)
    assert [(r["model"], r["process"]) for r in rows] == [("torchvision:a", 0), ("torchvision:a", 1),
                                                         ("timm:b", 0), ("timm:b", 1)]
    assert rows[1]["error"] == "process exited 1: RuntimeError: out of memory"
    assert rows[0]["header"] == {"gpu": "GPU X", "torch": "2.11"} and rows[0]["train_samples"]["eager"] == [11.0] * 3
    assert [c[c.index("--batch") + 1] for c in calls] == ["128"] * 4  # the settings reach every process


def test_the_table_gives_each_process_ratio_and_their_median(capsys):
    rows = [{"model": "m", "process": i, "train": {"eager": 10.0, "fused": f},
             "inference": {"eager": 4.0, "fused": 3.0}} for i, f in enumerate((9.0, 11.0, 9.5))]
    rows.append({"model": "m", "process": 3, "error": "process exited 1: boom"})
    rows[2]["inference"] = {"error": "RuntimeError: out of memory"}  # a mode that failed in one process
    zoo_speed.print_processes(rows)
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.split()[:2] == ["m", "3"]  # three processes measured
    assert "0.900, 1.100, 0.950 (0.950)" in line and line.endswith("0.750, 0.750 (0.750)"), line


def test_a_run_stopped_in_a_later_process_keeps_the_rows_before_it_in_its_json(monkeypatch, tmp_path):
    calls = []

    def fake_run(command, capture_output, text):
        calls.append(command)
        if len(calls) == 3:  # a time limit's SIGINT arrives while the third process runs
            raise KeyboardInterrupt
        path = command[command.index("--json") + 1]
        row = {"model": "torchvision:a", "train": {"eager": 10.0, "fused": 9.0 + len(calls)}}
        with open(path, "w") as f:
            json.dump({"gpu": "GPU X", "rows": [row]}, f)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(zoo_speed.subprocess, "run", fake_run)
    out = tmp_path / "rows.json"
    with pytest.raises(KeyboardInterrupt):
        zoo_speed.run_in_processes(["torchvision:a"], _args(3), str(out))
    written = json.loads(out.read_text())
    assert written["gpu"] == "GPU X" and written["processes"] == 3
    assert [(r["process"], r["train"]["fused"]) for r in written["rows"]] == [(0, 10.0), (1, 11.0)]


def test_a_run_stopped_in_its_first_process_leaves_a_file_with_no_rows(monkeypatch, tmp_path):
    def fake_run(command, capture_output, text):
        raise KeyboardInterrupt

    monkeypatch.setattr(zoo_speed.subprocess, "run", fake_run)
    out = tmp_path / "rows.json"
    with pytest.raises(KeyboardInterrupt):
        zoo_speed.run_in_processes(["torchvision:a"], _args(2), str(out))
    assert json.loads(out.read_text()) == {"processes": 2, "rows": []}
