"""`tidegate trace synth` (tidegate/offline/synth.py): the week's level follows the envelope and
the volume asked for; what is inside each hour (request sizes, bursts, idle minutes) is the
source trace's own."""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path

import pytest

from router.economics.schedule import WEEK_HOURS
from tidegate.cli.main import main
from tidegate.offline.replay import Arrival, load
from tidegate.offline.synth import (
    ENVELOPES,
    EnvelopeError,
    Volume,
    envelope,
    synthesize,
)

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"
CODE = TRACES / "AzureLLMInferenceTrace_code.csv"


@pytest.fixture(scope="module")
def code() -> list[Arrival]:
    return load(CODE)


def week(source: list[Arrival], name: str, per_day: float, seed: int = 0) -> list[list[Arrival]]:
    return list(synthesize(source, envelope(name), Volume(per_day), days=7, seed=seed))


@pytest.mark.parametrize("name", sorted(ENVELOPES))
def test_the_volume_asked_for_is_the_volume_written(code, name):
    hours = week(code, name, 20_000)
    assert len(hours) == WEEK_HOURS
    assert sum(map(len, hours)) == pytest.approx(7 * 20_000, rel=0.02)


def test_each_hour_follows_its_weight(code):
    hours = week(code, "office-hours", 20_000)
    weights = envelope("office-hours")
    busy = [len(h) for h, w in zip(hours, weights, strict=True) if w == 1.0]
    quiet = [len(h) for h, w in zip(hours, weights, strict=True) if w == 0.05]
    assert statistics.mean(busy) / statistics.mean(quiet) == pytest.approx(20, rel=0.05)
    saturday_noon, tuesday_noon = hours[5 * 24 + 12], hours[1 * 24 + 12]
    assert len(tuesday_noon) > 10 * len(saturday_noon) > 0


def test_a_zero_weight_hour_is_idle_and_the_rest_keep_the_volume(code, tmp_path):
    daily = tmp_path / "day.csv"
    daily.write_text("hour,weight\n" + "".join(f"{h},{1 if h in (9, 10) else 0}\n" for h in range(24)))
    hours = list(synthesize(code, envelope(str(daily)), Volume(1_000), days=2))
    assert [bool(h) for h in hours] == [h % 24 in (9, 10) for h in range(48)]
    assert sum(map(len, hours)) == pytest.approx(2_000, rel=0.05)


def test_sizes_are_the_sources_own_and_times_stay_in_their_hour(code):
    pairs = {(a.input_tokens, a.output_tokens) for a in code}
    for index, hour in enumerate(week(code, "two-batch-jobs", 5_000)):
        assert all((a.input_tokens, a.output_tokens) in pairs for a in hour)
        assert all(index * 3600 <= a.at_s < (index + 1) * 3600 for a in hour)
        assert [a.at_s for a in hour] == sorted(a.at_s for a in hour)


def test_an_hour_at_the_sources_rate_keeps_its_idle_minutes_and_bursts(code):
    """Scaled to the source's own hourly rate, an hour is the source's hour: the same busy and
    idle minutes (the source loops end to end every span of it, whole minutes)."""
    per_hour = len(code) * 3600 / (60 * 58)  # the trace spans 57.3 minutes: 58 whole ones
    first = next(synthesize(code, envelope("flat"), Volume(per_hour * 24), days=1 / 24))
    minutes = Counter(int(a.at_s // 60) for a in first)
    source = Counter(int(a.at_s // 60) for a in code)
    idle_source = {m for m in range(58) if source[m] == 0}
    idle_out = {m for m in range(58) if minutes[m] == 0}
    assert idle_source == idle_out
    busiest = max(source, key=lambda m: source[m])
    assert minutes[busiest] == pytest.approx(source[busiest], rel=0.2)


def test_the_same_seed_gives_the_same_week_and_another_seed_another(code):
    def two_days(seed: int) -> list[list[Arrival]]:
        return list(synthesize(code, envelope("office-hours"), Volume(3_000), days=2, seed=seed))

    one, again, other = two_days(1), two_days(1), two_days(2)
    assert one == again
    assert one != other


def test_tokens_per_day_converts_with_the_sources_mean_size(code):
    mean = statistics.mean(a.input_tokens + a.output_tokens for a in code)
    assert Volume.of_tokens(mean * 1_000, code).requests_per_day == pytest.approx(1_000)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1\n2\n3\n", "3 weights"),
        ("".join("1\n" for _ in range(23)) + "-1\n", ">= 0"),
        ("".join("0\n" for _ in range(24)), "not all 0"),
        ("".join("1\n" for _ in range(23)) + "lots\n", "'lots' is not a number"),
        ("".join("1\n" for _ in range(23)) + "nan\n", "finite"),
    ],
)
def test_a_bad_envelope_file_is_refused_with_what_is_wrong(tmp_path, text, message):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(EnvelopeError, match=message):
        envelope(str(path))


def test_a_week_file_of_168_weights_is_taken_as_is(tmp_path):
    path = tmp_path / "week.csv"
    path.write_text("# a comment\n" + "".join(f"{h % 7}\n" for h in range(168)))
    assert envelope(str(path)) == tuple(float(h % 7) for h in range(168))


def test_the_command_writes_a_trace_replay_reads_and_starts_where_asked(tmp_path, capsys):
    out = tmp_path / "week.csv"
    code = main(
        ["trace", "synth", "--from", str(CODE), "--envelope", "office-hours", "--days", "2",
         "--tokens-per-day", "2e6", "--start", "2026-01-10T00:00", "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    rows = load(out)
    assert out.read_text().splitlines()[1].startswith("2026-01-10 00:")  # a Saturday
    tokens = sum(a.input_tokens + a.output_tokens for a in rows)
    assert tokens / 2 == pytest.approx(2e6, rel=0.05)
    said = capsys.readouterr().out
    assert f"wrote {len(rows):,} requests over 2 days" in said and "(synthetic)" in said


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "--requests-per-day or --tokens-per-day"),
        (["--requests-per-day", "5", "--tokens-per-day", "5"], "one of them"),
        (["--requests-per-day", "0"], "must be > 0"),
        (["--requests-per-day", "5", "--envelope", "weekends"], "neither office-hours"),
        (["--requests-per-day", "5", "--start", "monday"], "monday"),
        (["--requests-per-day", "5", "--days", "0"], "--days must be > 0"),
    ],
)
def test_the_command_refuses_bad_input_with_a_clear_error(tmp_path, capsys, extra, message):
    args = ["trace", "synth", "--from", str(CODE), "--out", str(tmp_path / "x.csv"), *extra]
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_a_missing_source_is_a_clear_error(tmp_path, capsys):
    args = ["trace", "synth", "--from", str(tmp_path / "none.csv"), "--requests-per-day", "5"]
    assert main([*args, "--out", str(tmp_path / "x.csv")]) == 2
    assert "none.csv" in capsys.readouterr().err


def test_an_envelope_that_is_idle_over_the_whole_span_is_refused_before_writing(tmp_path, capsys):
    """Nothing to scale the volume to: a clear error and exit 2, not a traceback half-way
    through the file."""
    daily = tmp_path / "nine-to-eleven.csv"
    daily.write_text("".join(f"{1 if h in (9, 10) else 0}\n" for h in range(24)))
    out = tmp_path / "x.csv"
    args = ["trace", "synth", "--from", str(CODE), "--envelope", str(daily), "--requests-per-day", "5"]
    assert main([*args, "--days", "0.25", "--out", str(out)]) == 2
    assert "the envelope is 0 over the whole span" in capsys.readouterr().err
    assert not out.exists()
