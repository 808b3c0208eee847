"""benchmarks/zoo_speed.py's --processes (no GPU needed): each model timed in fresh processes, their rows gathered
with the process's number and the children's header, a failed process kept as a row with its error, the JSON
written after each process, the table of per-process ratios with their median, and --gpu-time's CUDA-graph
times: passed to every process, tabled with their ratios, a failed capture named."""

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import zoo_speed  # noqa: E402


def _args(processes, gpu_time=False):
    return SimpleNamespace(batch=128, size=224, dtype="bfloat16", warmup=3, repeats=10, calls=3, processes=processes,
                           gpu_time=gpu_time)


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


def test_gpu_time_reaches_every_process_and_is_left_out_without_it(monkeypatch):
    calls = []

    def fake_run(command, capture_output, text):
        calls.append(command)
        return subprocess.CompletedProcess(command, 1, "", "boom")

    monkeypatch.setattr(zoo_speed.subprocess, "run", fake_run)
    zoo_speed.run_in_processes(["torchvision:a"], _args(2, gpu_time=True))
    zoo_speed.run_in_processes(["torchvision:a"], _args(1))
    assert ["--gpu-time" in c for c in calls] == [True, True, False]


def test_the_gpu_time_table_gives_ratios_names_a_failed_capture_and_a_slower_fused_step(capsys):
    capture_error = "RuntimeError: operation not permitted when stream is capturing"
    rows = [{"model": "a", "convs_fused": 2, "convs": 2, "train": {"eager": 30.0, "fused": 31.0},
             "inference": {"eager": 8.0, "fused": 6.0}, "train_gpu": {"eager": 20.0, "fused": 15.0},
             "inference_gpu": {"eager": 5.0, "fused": capture_error}},
            {"model": "b", "convs_fused": 1, "convs": 1, "train": {"eager": 10.0, "fused": 9.0},
             "inference": {"eager": 4.0, "fused": 3.0}, "train_gpu": {"eager": 8.0, "fused": 8.8},
             "inference_gpu": {"eager": 3.0, "fused": 2.4}}]
    zoo_speed.print_table(rows)
    out = capsys.readouterr().out.splitlines()
    gpu = out[out.index(next(line for line in out if line.startswith("GPU time a step"))):]
    row_a = next(line for line in gpu if line.startswith("a "))
    assert "0.750x" in row_a and "failed" in row_a and "nanx" in row_a, row_a
    assert "1.100x" in next(line for line in gpu if line.startswith("b ")) and "0.800x" in gpu[3]
    assert f"not captured: a inference fused: {capture_error}" in gpu
    assert gpu[-1] == "fused's GPU time above eager's: b train 1.100x"
    assert "fused slower than eager: a train 1.033x" in out  # the sampled steps' line stays as it was


def test_the_gpu_time_table_is_left_out_of_a_run_without_it(capsys):
    zoo_speed.print_table([{"model": "a", "convs_fused": 1, "convs": 1, "train": {"eager": 2.0, "fused": 1.0},
                            "inference": {"eager": 2.0, "fused": 1.0}}])
    assert "GPU time" not in capsys.readouterr().out


def test_the_process_table_adds_the_gpu_time_ratios_where_they_were_taken(capsys):
    rows = [{"model": "m", "process": i, "train": {"eager": 10.0, "fused": 9.0}, "inference": {"eager": 4.0,
             "fused": 3.0}, "train_gpu": {"eager": 8.0, "fused": g}, "inference_gpu": {"eager": 2.0, "fused": 1.0}}
            for i, g in enumerate((6.0, 7.0))]
    zoo_speed.print_processes(rows)
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.endswith("0.900, 0.900 (0.900)  |  0.750, 0.750 (0.750)  |  0.750, 0.875 (0.812)  |  0.500, 0.500 "
                         "(0.500)"), line
