"""results.md and the PNG plots, from synthetic records."""

import json

import pytest

from s4kv.bench import plots, report, testing

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def recs():
    return testing.sample_records()


def test_markdown_tables(recs):
    md = report.markdown(recs, {"capacity": "capacity.png"})
    assert "## Capacity" in md and "## Quality" in md and "## Speed" in md and "## Not measured" in md
    assert "| `int4_kivi` | 140,000 | 3.50× |" in md
    assert "| `auto` | 40,000 | 1.00× |" in md
    assert "![capacity](capacity.png)" in md
    assert "`auto (repeat)`" in md
    assert "| capacity | `turboquant_4bit_nc` | refused | not on cpu |" in md
    assert "87.30%" in md  # top-1 agreement 55/63
    assert "= 7 6 5" in md  # first divergences
    assert "1/4" in md  # identical greedy
    assert "s4kv bench all --model smollm2" in md


def test_floor_engine_is_named_and_explained():
    recs = [testing.record("quality", "auto"), testing.record("quality", "int4_kivi"),
            testing.record("quality", "auto", 2)]
    recs[2]["params"]["floor_engine_args"] = {"attention_backend": "TRITON_ATTN"}
    md = report.markdown(testing.records_with_comparisons(recs))
    assert "| `auto (attention_backend=TRITON_ATTN)` |" in md
    assert "another attention kernel" in md and "the noise floor" not in md


def test_quality_rows(recs):
    rows = {r["label"]: r for r in report.quality_rows(recs)}
    assert set(rows) == {"auto", "fp8", "int4_kivi", "auto (repeat)"}
    assert rows["auto"]["ppl_delta_pct"] == 0.0
    assert rows["auto (repeat)"]["identical"] == 4


def test_capacity_figure_series(recs):
    fig = plots.capacity_figure(recs)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["auto", "fp8", "int4_kivi"]
    assert [p.get_height() for p in ax.patches] == [40000, 80000, 140000]
    assert any("3.50× auto" in t.get_text() for t in ax.texts)


def test_speed_figure_series(recs):
    ax = plots.speed_figure(recs).axes[0]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    assert set(lines) == {"auto", "fp8", "int4_kivi", "auto (saturated)", "fp8 (saturated)",
                          "int4_kivi (saturated)"}
    assert list(lines["auto"].get_xdata()) == [1024, 8192, 32768]
    assert list(lines["int4_kivi"].get_ydata()) == pytest.approx([4e3 * 1.35 * 1024 / c for c in
                                                                  (1024, 8192, 32768)])
    assert ax.get_xscale() == "log"


def test_quality_figure_cells(recs):
    cells = plots.quality_cells(recs)
    assert [c[0] for c in cells] == ["auto", "fp8", "int4_kivi", "auto (repeat)"]
    assert cells[1][3] == "87.30%" and cells[1][4] == "1/4"
    fig = plots.quality_figure(recs)
    texts = {c.get_text().get_text() for c in fig.axes[0].tables[0].get_celld().values()}
    assert "int4_kivi" in texts and "top-1 agr." in texts


def test_write_plots_png(tmp_path, recs):
    written = plots.write_plots(recs, tmp_path)
    # the sample has no serving records, so no serve_* plots
    assert written == {k: plots.FILES[k] for k in ("capacity", "speed", "quality")}
    for name in written.values():
        data = (tmp_path / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000


def test_nothing_to_plot(tmp_path):
    recs = testing.records_with_comparisons([testing.record("capacity", "auto", status="refused", reason="x")])
    assert plots.write_plots(recs, tmp_path) == {}
    assert plots.speed_figure(recs) is None
    md = report.markdown(recs)
    assert "## Not measured" in md and "## Capacity" not in md


def test_no_preflight_override_is_flagged():
    recs = [testing.record("quality", "auto"), testing.record("quality", "turboquant_4bit_nc")]
    recs[1]["preflight"] = {"status": "refused", "reason": "CPU_ATTN does not support it", "backend": "CPU_ATTN"}
    md = report.markdown(testing.records_with_comparisons(recs))
    assert "**run with --no-preflight**: `turboquant_4bit_nc`" in md
    assert "## Not supported here" in md and "| `turboquant_4bit_nc` | CPU_ATTN does not support it |" in md
    assert "noise floor" not in md


def test_not_measured_grouped_by_reason():
    recs = [testing.record(k, kv, status="refused", reason="needs AVX-512")
            for k in ("capacity", "quality") for kv in ("fp8", "fp8_e5m2")]
    recs += [testing.record("speed", kv, status="refused", reason="CUDA only") for kv in ("auto", "fp8")]
    recs += [testing.record("capacity", "nvfp4", status="failed", reason="boom"),
             testing.record("speed", "int4_kivi", status="failed", reason="boom")]
    table = report.not_ok_table(recs)
    assert "| capacity, quality | `fp8`, `fp8_e5m2` | refused | needs AVX-512 |" in table
    assert "| speed | `auto`, `fp8` | refused | CUDA only |" in table
    assert "| capacity `nvfp4`; speed `int4_kivi` |  | failed | boom |" in table
    assert len(table.splitlines()) == 2 + 3


def test_kernel_launch_options_are_recorded_and_shown(tmp_path, monkeypatch):
    """A run under S4KV_KERNEL_CONFIG (launch options replacing the kernels' defaults, as
    tools/gpu/run-on-device.sh sets after a tune) records them in every record's env and names them
    in results.md: its timings are of those launches, not of the defaults."""
    from s4kv.bench import worker

    options = [{"kernel": "decode-reduce", "head_size": 128, "options": {"PART_ROWS": 64}}]
    config = tmp_path / "kernel-config.json"
    config.write_text(json.dumps(options))
    monkeypatch.setenv("S4KV_KERNEL_CONFIG", str(config))
    env = worker.environment()
    assert env["kernel_config"] == options
    recs = [testing.record("speed", "auto"), testing.record("speed", "int4_kivi")]
    for r in recs:
        r["env"] = {**r["env"], "kernel_config": env["kernel_config"]}
    md = report.markdown(testing.records_with_comparisons(recs))
    assert f"- **kernel launch options** (`S4KV_KERNEL_CONFIG`, replacing the defaults): `{json.dumps(options)}`" in md
    monkeypatch.delenv("S4KV_KERNEL_CONFIG")
    assert "kernel_config" not in worker.environment()
    assert "kernel launch options" not in report.markdown(testing.records_with_comparisons([testing.record("speed", "auto")]))
