"""The pure parts of scripts/bench_vs_llamacpp.py: parsing llama.cpp's outputs, the CMake flag choice
from /proc/cpuinfo, the build cache key and the ratio/target table. Nothing here builds or runs
llama.cpp."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import bench_vs_llamacpp as bvl
import llamacpp_build as lb

# llama-bench 0.3.36 -o json as captured on this machine (-p 16 -n 8 -r 1), plus a hand-made -pg record.
LLAMA_BENCH_JSON = """[
  {
    "build_commit": "0c1e570",
    "build_number": 1,
    "cpu_info": "AMD EPYC",
    "gpu_info": "",
    "backends": "CPU",
    "model_filename": "/root/.cache/infer/models/SmolLM2-135M-Instruct.Q4_1.gguf",
    "model_type": "llama 256M Q4_1",
    "model_size": 96576768,
    "model_n_params": 134515008,
    "n_batch": 2048,
    "n_ubatch": 512,
    "n_threads": 2,
    "cpu_mask": "0x0",
    "cpu_strict": false,
    "poll": 50,
    "type_k": "f16",
    "type_v": "f16",
    "n_gpu_layers": -1,
    "n_cpu_moe": 0,
    "split_mode": "layer",
    "main_gpu": 0,
    "no_kv_offload": false,
    "flash_attn": -1,
    "devices": "auto",
    "tensor_split": "0.00",
    "tensor_buft_overrides": "none",
    "load_mode": "auto",
    "lazy_mode": "auto",
    "embeddings": false,
    "no_op_offload": 0,
    "no_host": false,
    "repack": true,
    "fit_target": 0,
    "fit_min_ctx": 0,
    "n_prompt": 16,
    "n_gen": 0,
    "n_depth": 0,
    "test_time": "2026-12-01T05:31:06Z",
    "avg_ns": 37557126,
    "stddev_ns": 0,
    "avg_ts": 426.017688,
    "stddev_ts": 0.000000,
    "samples_ns": [ 37557126 ],
    "samples_ts": [ 426.018 ]
  },
  {
    "build_commit": "0c1e570",
    "build_number": 1,
    "cpu_info": "AMD EPYC",
    "gpu_info": "",
    "backends": "CPU",
    "model_filename": "/root/.cache/infer/models/SmolLM2-135M-Instruct.Q4_1.gguf",
    "model_type": "llama 256M Q4_1",
    "model_size": 96576768,
    "model_n_params": 134515008,
    "n_batch": 2048,
    "n_ubatch": 512,
    "n_threads": 2,
    "cpu_mask": "0x0",
    "cpu_strict": false,
    "poll": 50,
    "type_k": "f16",
    "type_v": "f16",
    "n_gpu_layers": -1,
    "n_cpu_moe": 0,
    "split_mode": "layer",
    "main_gpu": 0,
    "no_kv_offload": false,
    "flash_attn": -1,
    "devices": "auto",
    "tensor_split": "0.00",
    "tensor_buft_overrides": "none",
    "load_mode": "auto",
    "lazy_mode": "auto",
    "embeddings": false,
    "no_op_offload": 0,
    "no_host": false,
    "repack": true,
    "fit_target": 0,
    "fit_min_ctx": 0,
    "n_prompt": 0,
    "n_gen": 8,
    "n_depth": 0,
    "test_time": "2026-12-01T05:31:06Z",
    "avg_ns": 39463299,
    "stddev_ns": 0,
    "avg_ts": 202.720001,
    "stddev_ts": 0.000000,
    "samples_ns": [ 39463299 ],
    "samples_ts": [ 202.72 ]
  },
  {
    "n_prompt": 64,
    "n_gen": 16,
    "avg_ts": 300.0,
    "stddev_ts": 0.0
  }
]
"""

BATCHED_BENCH_OUT = """\
llama_model_loader: loaded meta data with 33 key-value pairs
llama_batched_bench: n_kv_max = 4096, n_batch = 2048, n_ubatch = 512, flash_attn = -1, is_pp_shared = 0, \
is_tg_separate = 0, n_gpu_layers = -1, n_threads = 2, n_threads_batch = 2

|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|    32 |     64 |   16 |   1536 |    0.410 |  1248.78 |    3.200 |   320.00 |    3.610 |   425.48 |

llama_perf_context_print:        load time =      80.00 ms
"""


def test_llama_bench_json_gives_tps_per_test() -> None:
    got = bvl.parse_llama_bench_json(LLAMA_BENCH_JSON)
    assert got == {"pp16": 426.017688, "tg8": 202.720001, "pp64+tg16": 300.0}


def test_batched_bench_table_row() -> None:
    rows = bvl.parse_batched_bench_table(BATCHED_BENCH_OUT)
    assert len(rows) == 1
    row = rows[0]
    assert (row.pp, row.tg, row.b, row.n_kv) == (32, 64, 16, 1536)
    assert row.s_tg == 320.0 and row.s_pp == 1248.78 and row.t == 3.61
    # Generated tokens over the whole run: 16 * 64 / 3.61.
    assert row.generated_per_s == pytest.approx(1024 / 3.61)


def test_batched_bench_table_ignores_header_and_log_lines() -> None:
    header_only = "\n".join(BATCHED_BENCH_OUT.splitlines()[:5])
    assert bvl.parse_batched_bench_table(header_only) == []
    # A row captured from llama-batched-bench 0.3.36 (-npp 8 -ntg 4 -npl 2) after the first one.
    two = (
        BATCHED_BENCH_OUT
        + "|     8 |      4 |    2 |     24 |    0.038 |   426.46 |    0.044 |   182.81 |"
        + "    0.081 |   295.28 |\n"
    )
    rows = bvl.parse_batched_bench_table(two)
    assert [r.b for r in rows] == [16, 2] and rows[1].s_tg == 182.81
    assert rows[1].generated_per_s == pytest.approx(8 / 0.081)


def test_infer_bench_tps_matches_shape_not_name() -> None:
    report = {
        "results": [
            {"test": "tg64", "n_prompt": 0, "n_gen": 64, "concurrency": 1, "tps_mean": 70.0},
            {"test": "tg64 c16", "n_prompt": 32, "n_gen": 64, "concurrency": 16, "tps_mean": 250.0},
            {"test": "pp512", "n_prompt": 512, "n_gen": 0, "concurrency": 1, "tps_mean": 900.0},
        ]
    }
    assert bvl.infer_bench_tps(report, 0, 64) == 70.0
    assert bvl.infer_bench_tps(report, 32, 64, concurrency=16) == 250.0
    assert bvl.infer_bench_tps(report, 512, 0) == 900.0
    with pytest.raises(bvl.RunError, match="n=128"):
        bvl.infer_bench_tps(report, 0, 128)
    report["results"][1]["errors"] = 2
    with pytest.raises(bvl.RunError, match="2 request"):
        bvl.infer_bench_tps(report, 32, 64, concurrency=16)


CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
flags\t\t: fpu sse sse2 ssse3 fma sse4_1 sse4_2 avx f16c bmi1 avx2 bmi2 avx512f avx512dq avx512cd \
avx512bw avx512vl avx_vnni avx512_bf16 avx512vbmi avx512_vbmi2 avx512_vnni amx_tile amx_int8 amx_bf16
bugs\t\t: sysret_ss_attrs
"""


def test_cpuinfo_flags_reads_first_flags_line() -> None:
    flags = lb.cpuinfo_flags(CPUINFO)
    assert {"avx2", "avx512_vnni", "amx_tile"} <= flags
    assert "sysret_ss_attrs" not in flags
    assert lb.cpuinfo_flags("processor\t: 0\n") == set()


def test_cmake_options_full_avx512_machine_keeps_amx_and_blas_off() -> None:
    opts = lb.cmake_options(lb.cpuinfo_flags(CPUINFO))
    for key in (
        "GGML_AVX",
        "GGML_AVX2",
        "GGML_FMA",
        "GGML_F16C",
        "GGML_BMI2",
        "GGML_AVX_VNNI",
        "GGML_AVX512",
        "GGML_AVX512_VBMI",
        "GGML_AVX512_VNNI",
        "GGML_AVX512_BF16",
    ):
        assert opts[key] == "ON", key
    # The CPU reports AMX, but a native AMX build segfaults where the kernel grants no AMX state.
    assert opts["GGML_AMX_TILE"] == opts["GGML_AMX_INT8"] == opts["GGML_AMX_BF16"] == "OFF"
    assert opts["GGML_NATIVE"] == "OFF" and opts["GGML_BLAS"] == "OFF"


def test_cmake_options_avx2_only_machine() -> None:
    opts = lb.cmake_options({"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"})
    assert opts["GGML_AVX2"] == "ON" and opts["GGML_FMA"] == "ON"
    assert opts["GGML_AVX512"] == opts["GGML_AVX_VNNI"] == "OFF"


def test_an_avx2_only_build_of_an_avx512_host_keeps_avx2_and_drops_vnni_and_avx512() -> None:
    """`--avx2-only` (llamacpp_build, bench_sizes): the build set beside infer compiled for `haswell`."""
    opts = lb.cmake_options(lb.avx2_only(lb.cpuinfo_flags(CPUINFO)))
    assert opts["GGML_AVX2"] == opts["GGML_FMA"] == opts["GGML_F16C"] == opts["GGML_BMI2"] == "ON"
    for key in ("GGML_AVX_VNNI", "GGML_AVX512", "GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16"):
        assert opts[key] == "OFF", key
    assert lb.options_key("0.3.36", opts) != lb.options_key(
        "0.3.36", lb.cmake_options(lb.cpuinfo_flags(CPUINFO))
    )


def test_cmake_options_avx512_extensions_need_the_full_avx512_base() -> None:
    # avx512f without bw/vl (Knights Landing style) cannot build ggml's AVX512 path, so neither it nor
    # its extensions are switched on even when the extension flags are present.
    opts = lb.cmake_options({"avx", "avx2", "avx512f", "avx512cd", "avx512_vnni", "avx512vbmi"})
    assert opts["GGML_AVX512"] == "OFF"
    assert opts["GGML_AVX512_VNNI"] == opts["GGML_AVX512_VBMI"] == "OFF"
    assert lb.cmake_options(set())["GGML_AVX"] == "OFF"


def test_options_key_changes_with_version_and_flags() -> None:
    a = lb.cmake_options({"avx", "avx2"})
    b = lb.cmake_options({"avx"})
    assert lb.options_key("0.3.36", a) == lb.options_key("0.3.36", dict(reversed(list(a.items()))))
    assert lb.options_key("0.3.36", a) != lb.options_key("0.3.36", b)
    assert lb.options_key("0.3.36", a) != lb.options_key("0.3.37", a)
    assert lb.options_key("0.3.36", a).startswith("0.3.36-")


def test_sdist_version_from_file_name() -> None:
    assert lb.sdist_version(Path("llama_cpp_python-0.3.36.tar.gz")) == "0.3.36"
    with pytest.raises(lb.BuildError):
        lb.sdist_version(Path("llama_cpp_python-0.3.36-cp311-linux_x86_64.whl"))


def test_default_cache_dir_follows_infer_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("INFER_HOME", str(tmp_path))
    assert lb.default_cache_dir() == tmp_path / "llamacpp-build"
    monkeypatch.delenv("INFER_HOME")
    assert lb.default_cache_dir() == Path.home() / ".cache" / "infer" / "llamacpp-build"


def test_missing_cmake_is_a_one_line_build_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(lb.shutil, "which", lambda name: None)
    with pytest.raises(lb.BuildError, match="cmake not found"):
        lb.ensure_built(tmp_path, {"avx2"})
    assert not any(tmp_path.iterdir())


def test_existing_build_is_reused_without_cmake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    flags = {"avx", "avx2", "fma", "f16c"}
    (tmp_path / "sdist").mkdir()
    (tmp_path / "sdist" / "llama_cpp_python-0.3.36.tar.gz").write_bytes(b"")
    bin_dir = tmp_path / f"build-{lb.options_key('0.3.36', lb.cmake_options(flags))}" / "bin"
    bin_dir.mkdir(parents=True)
    for name in lb.TARGETS:
        (bin_dir / name).write_text("")
    (bin_dir.parent / lb.COMPLETE).write_text("{}")

    def no_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("cmake must not run when the build exists")

    monkeypatch.setattr(lb.subprocess, "run", no_run)
    # A finished build needs no cmake.
    monkeypatch.setattr(lb.shutil, "which", lambda name: None)
    got = lb.ensure_built(tmp_path, flags)
    assert got.bench == bin_dir / "llama-bench" and got.build_seconds == 0.0 and got.version == "0.3.36"
    # Flags that change an option mean another build folder, which does not exist yet: that builds.
    monkeypatch.setattr(lb, "_extract_sources", lambda sdist, cache, version: tmp_path)
    with pytest.raises(lb.BuildError, match="cmake not found"):
        lb.ensure_built(tmp_path, flags | {"bmi2"})
    monkeypatch.setattr(lb.shutil, "which", lambda name: f"/usr/bin/{name}")
    with pytest.raises(AssertionError, match="must not run"):
        lb.ensure_built(tmp_path, flags | {"bmi2"})
    # Binaries without the stamp (an interrupted build) are rebuilt too.
    (bin_dir.parent / lb.COMPLETE).unlink()
    with pytest.raises(AssertionError, match="must not run"):
        lb.ensure_built(tmp_path, flags)


def test_server_is_built_in_the_bench_folder_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    flags = {"avx", "avx2"}
    (tmp_path / "sdist").mkdir()
    (tmp_path / "sdist" / "llama_cpp_python-0.3.36.tar.gz").write_bytes(b"")
    build_dir = tmp_path / f"build-{lb.options_key('0.3.36', lb.cmake_options(flags))}"
    (build_dir / "bin").mkdir(parents=True)
    for name in lb.TARGETS:
        (build_dir / "bin" / name).write_text("")
    (build_dir / lb.COMPLETE).write_text("{}")
    commands: list[list[str]] = []

    def fake_run(cmd: list[str], **kwargs: object) -> object:
        commands.append(cmd)
        if "--build" in cmd:
            (build_dir / "bin" / lb.SERVER_TARGET).write_text("")
        return lb.subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(lb.subprocess, "run", fake_run)
    monkeypatch.setattr(lb.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(lb, "_extract_sources", lambda sdist, cache, version: tmp_path / "src")
    server = lb.ensure_server_built(tmp_path, flags, log=lambda line: None)
    assert server == build_dir / "bin" / "llama-server"
    configure, build = commands
    assert "-DLLAMA_BUILD_SERVER=ON" in configure and str(build_dir) in configure
    assert build[build.index("--target") + 1] == "llama-server"
    # Stamped: a second call builds nothing.
    assert lb.ensure_server_built(tmp_path, flags) == server and len(commands) == 2


def _fig(name: str, infer: float, llama: float, kind: str, target: float, unit: str = "tok/s") -> bvl.Figure:
    return bvl.Figure(name, unit, infer, llama, kind, target, "infer x", "llama y")


def test_figure_ratio_and_pass_rules() -> None:
    decode = _fig("decode", 90.0, 100.0, "ratio_min", 1.0)
    assert decode.ratio == pytest.approx(0.9) and not decode.passed
    assert _fig("decode", 100.0, 100.0, "ratio_min", 1.0).passed
    rss = _fig("rss", 390.0, 130.0, "abs_max", 400, "MB")
    assert rss.ratio == pytest.approx(3.0) and rss.passed
    assert not _fig("rss", 401.0, 130.0, "abs_max", 400, "MB").passed
    assert rss.target_text == "<= 400 MB" and decode.target_text == ">= 1x"
    record = json.loads(json.dumps(decode.to_json()))
    assert record["ratio"] == pytest.approx(0.9) and record["passed"] is False and record["infer"] == 90.0


def test_decode_target_follows_kernel_mode() -> None:
    assert bvl.decode_target([], None) == (1.3, "int8")  # the default mode
    assert bvl.decode_target(["--profile", "cpu-int8.yaml"], None) == (1.3, "int8")
    assert bvl.decode_target(["--cpu-kernels", "exact"], None) == (1.0, "exact")
    assert bvl.decode_target(["--cpu-kernels=blas"], None) == (1.0, "blas")
    assert bvl.decode_target(["--profile", "x"], 1.2) == (1.2, "int8")


def test_render_table_has_one_row_per_figure_with_verdicts() -> None:
    figures = [
        _fig("batch-1 decode, exact", 40.0, 80.0, "ratio_min", 1.0),
        _fig("prefill 512", 3000.0, 1500.0, "ratio_min", 1.5),
        _fig("peak RSS", 1024.0, 133.0, "abs_max", 400, "MB"),
    ]
    lines = bvl.render_table(figures).splitlines()
    assert lines[0].split() == ["figure", "infer", "llama.cpp", "ratio", "target", "result"]
    assert len(lines) == 2 + len(figures)
    assert lines[2].startswith("batch-1 decode, exact (tok/s)") and "0.50x" in lines[2]
    assert lines[2].endswith("FAIL") and lines[3].endswith("pass") and lines[4].endswith("FAIL")
    assert "2.00x" in lines[3] and "<= 400 MB" in lines[4] and "1,024.0" in lines[4]


def test_failed_configure_is_a_one_line_build_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "sdist").mkdir()
    (tmp_path / "sdist" / "llama_cpp_python-0.3.36.tar.gz").write_bytes(b"")
    monkeypatch.setattr(lb, "_extract_sources", lambda sdist, cache, version: tmp_path)
    monkeypatch.setattr(lb.shutil, "which", lambda name: f"/usr/bin/{name}")
    monkeypatch.setattr(lb.subprocess, "run", lambda *a, **k: lb.subprocess.CompletedProcess(a, 1))
    with pytest.raises(lb.BuildError, match=r"configure failed \(exit 1\); log: .*build\.log") as info:
        lb.ensure_built(tmp_path, {"avx2"})
    assert "\n" not in str(info.value)
    assert not list(tmp_path.glob(f"build-*/{lb.COMPLETE}"))


def test_main_exits_2_with_one_line_on_build_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise lb.BuildError("cmake not found on PATH (install cmake and a C++ compiler)")

    monkeypatch.setattr(bvl, "ensure_built", fail)
    assert bvl.main(["--cache", "/nonexistent"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "bench_vs_llamacpp: cmake not found on PATH (install cmake and a C++ compiler)\n"


def test_main_prints_the_table_or_json_from_measured_figures(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bins = lb.Binaries(tmp_path / "llama-bench", tmp_path / "llama-batched-bench", "0.3.36", {}, 0.0)
    figures = [_fig("batch-1 decode, int8", 130.0, 100.0, "ratio_min", 1.3)]
    extra = {"load_average_1m": [0.9, 3.5], "llamacpp_16_stream_s_tg": 376.3}
    seen: dict[str, object] = {}

    def fake_measure(setup: bvl.Setup, target: float, mode: str, say: object) -> tuple[list, dict]:
        seen.update(target=target, mode=mode, infer=setup.infer("bench"), llama=setup.llamacpp_args)
        return figures, extra

    monkeypatch.setattr(bvl, "ensure_built", lambda *a, **k: bins)
    monkeypatch.setattr(bvl, "measure", fake_measure)
    argv = ["--model", str(tmp_path / "m.gguf"), "--threads", "2", "--infer-args", "--profile cpu-int8"]
    assert bvl.main([*argv, "--llamacpp-args", "--poll 0"]) == 0
    out = capsys.readouterr().out
    assert seen["target"] == 1.3 and seen["mode"] == "int8" and seen["llama"] == ["--poll", "0"]
    assert seen["infer"][-4:] == ["--threads", "2", "--profile", "cpu-int8"]
    assert "batch-1 decode, int8 (tok/s)" in out and "1.30x" in out and "pass" in out
    assert "376.3" in out and "figures are contended" in out

    assert bvl.main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["threads"] == 2 and report["llamacpp"]["version"] == "0.3.36"
    assert report["figures"][0]["ratio"] == pytest.approx(1.3) and report["figures"][0]["passed"] is True


def test_infer_bench_draws_greedily_unless_told_a_temperature(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """llama-bench and llama-batched-bench never sample, so infer's throughput runs draw by argmax
    (--temp 0) by default; --infer-temp puts the sampler chain back."""
    bins = lb.Binaries(tmp_path / "llama-bench", tmp_path / "llama-batched-bench", "0.3.36", {}, 0.0)
    commands: list[list[str]] = []

    class Done:
        stdout = '{"results": []}'

    def fake_run(command: list[str], what: str) -> Done:
        commands.append(command)
        return Done()

    monkeypatch.setattr(bvl, "run", fake_run)
    bvl.Setup(bins, tmp_path / "m.gguf", 2, 1, [], []).infer_bench("-p", "512")
    bvl.Setup(bins, tmp_path / "m.gguf", 2, 1, [], [], 0.8).infer_bench("-p", "512")
    temps = [command[command.index("--temp") + 1] for command in commands]
    assert temps == ["0.0", "0.8"]
