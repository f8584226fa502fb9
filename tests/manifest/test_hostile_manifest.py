"""No manifest line ends a run: ``validate`` and ``synth`` on good rows mixed with hostile lines.

The fixed case is the issue's: every known hostile line between good rows runs to the end with
exit 3, no traceback, every good row done and every hostile line named by its line. The property
tests generate manifests from the JSON grammar, random bytes and the hostile cases, and check the
same of every one: exit 0 or 3, no traceback, each non-blank line either a row or named in an
error, and a good row's WAV byte-identical to the same row run alone (batch size 1 on both sides,
so the batch cannot move a sample). ``COSYCLONE_PROPERTY_EXAMPLES`` raises the example counts.
"""

from __future__ import annotations

import json
import os
import re
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cosyclone.cli import app
from cosyclone.folder.layout import wav_path
from tests.manifest.test_manifest_hostile import HOSTILE, PROMPT

SCALE = int(os.environ.get("COSYCLONE_PROPERTY_EXAMPLES", "1"))
FAST = ["--max-tokens", "4", "--n-timesteps", "2", "--device", "cpu", "--batch-size", "1", "--quiet"]
#: The good rows a generated manifest may hold (fixed, so each one's lone WAV is made once).
GOOD = [{"id": f"good{i}", "prompt_audio": PROMPT, "prompt_text": "reference words", "text": text}
        for i, text in enumerate(["A plain sentence to speak.", "Another one, a little longer than that.",
                                  "Short."])]
GOOD_LINES = [json.dumps(row).encode() for row in GOOD]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
row_like = st.fixed_dictionaries(  # near misses of a row: right keys, arbitrary values
    {"id": st.text(max_size=12) | st.integers(), "prompt_audio": st.just(PROMPT) | st.text(max_size=10),
     "text": st.text(max_size=30) | json_values},
    optional={"mode": st.sampled_from(["zero_shot", "cross_lingual", "instruct2", "bogus"]),
              "prompt_text": st.text(max_size=20), "seed": st.integers(min_value=-5, max_value=2**66),
              "speed": st.floats(allow_nan=True), "instruct": st.text(max_size=10)})
lines = st.one_of(
    st.sampled_from(GOOD_LINES),
    st.sampled_from(sorted(HOSTILE)).map(lambda name: HOSTILE[name][0]),
    json_values.map(lambda v: json.dumps(v).encode()),
    row_like.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=40).map(lambda b: b.replace(b"\n", b" ")),
    st.text(max_size=40).map(lambda t: t.replace("\n", " ").encode("utf-8", "surrogatepass")),
)
manifests = st.lists(lines, min_size=1, max_size=8)


def _write(folder: Path, body: list[bytes]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "m.jsonl"
    path.write_bytes(b"\n".join(body) + b"\n")
    return path


def _nonblank(body: list[bytes]) -> set[int]:
    # the manifest's own rule: lines end at \n, a trailing \r and a leading BOM do not count
    text = (b"\n".join(body) + b"\n").removeprefix(b"\xef\xbb\xbf").split(b"\n")
    return {k for k, raw in enumerate(text, start=1) if raw.removesuffix(b"\r").strip()}


def _named_lines(output: str) -> set[int]:
    return {int(n) for n in re.findall(r"m\.jsonl: line (\d+)", output)}


def _assert_clean_exit(res) -> None:
    assert res.exit_code in (0, 3), res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output, res.output


@settings(max_examples=150 * SCALE, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(body=manifests)
def test_validate_names_every_line_that_is_not_a_row(body: list[bytes], tmp_path_factory) -> None:
    path = _write(tmp_path_factory.mktemp("v"), body)
    res = CliRunner().invoke(app, ["validate", str(path)])
    _assert_clean_exit(res)
    counts = re.search(r"(\d+) valid rows, (\d+) rejected", res.output)
    assert counts is not None, res.output
    valid, rejected = map(int, counts.groups())
    named = _named_lines(res.output)
    assert len(named) == rejected and named <= _nonblank(body)
    assert valid + rejected == len(_nonblank(body))


@cache
def _alone(model_dir: str, index: int, folder: str) -> bytes:
    """The WAV bytes of GOOD[index] synthesized on its own."""
    out = Path(folder) / f"alone{index}"
    path = _write(out / "in", [json.dumps(GOOD[index]).encode()])
    res = CliRunner().invoke(
        app, ["synth", str(path), "--model-dir", model_dir, "--out", str(out / "out"), *FAST]
    )
    assert res.exit_code == 0, res.output
    return wav_path(out / "out", f"good{index}").read_bytes()


def _check_synth(body: list[bytes], model_dir: Path, work: Path, cache_dir: Path) -> tuple[int, set[int]]:
    path = _write(work / "in", body)
    res = CliRunner().invoke(
        app, ["synth", str(path), "--model-dir", str(model_dir), "--out", str(work / "out"), *FAST]
    )
    _assert_clean_exit(res)
    diag = work / "out" / "diagnostics.jsonl"
    records = [json.loads(x) for x in diag.read_text().splitlines()] if diag.exists() else []
    ok = {r["line"]: r["id"] for r in records if r["status"] == "ok"}
    named = _named_lines(res.output)
    assert set(ok) | named == _nonblank(body) and not set(ok) & named, res.output
    for line, rid in ok.items():
        # a generated row that happens to be valid: no lone WAV to compare
        if body[line - 1] not in GOOD_LINES:
            continue
        index = GOOD_LINES.index(body[line - 1])
        wav = wav_path(work / "out", rid).read_bytes()
        assert wav == _alone(str(model_dir), index, str(cache_dir)), (line, rid)
    return res.exit_code, named


def test_synth_runs_past_every_known_hostile_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    names = sorted(HOSTILE)
    body = [json.dumps(GOOD[0]).encode()] + [HOSTILE[n][0] for n in names] + [json.dumps(GOOD[1]).encode()]
    code, named = _check_synth(body, tiny_model_dir, tmp_path / "mixed", tmp_path / "cache")
    assert code == 3 and named == set(range(2, len(body)))
    res = CliRunner().invoke(app, ["validate", str(tmp_path / "mixed" / "in" / "m.jsonl")])
    assert res.exit_code == 3 and f"2 valid rows, {len(names)} rejected" in res.output


@pytest.mark.slow
@settings(max_examples=4 * SCALE, derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(body=manifests.filter(lambda b: any(x in GOOD_LINES for x in b)))
def test_synth_produces_every_good_row_whatever_surrounds_it(body: list[bytes], tiny_model_dir: Path,
                                                            tmp_path_factory) -> None:
    _check_synth(body, tiny_model_dir, tmp_path_factory.mktemp("s"), tmp_path_factory.getbasetemp() / "alone")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["evil \u202etxt"], "TEXT: holds a bidi control"),
        (["abc\ud800"], "TEXT: holds a lone surrogate"),  # what a non-UTF-8 argv byte decodes to
        (["fine", "--prompt-text", "a\u0000b"], "--prompt-text: holds a control character"),
        (
            ["fine", "--prompt-text", "words", "--seed", str(2**64)],
            "--seed: seed must be an integer in 0..2**64-1",
        ),
    ],
)
def test_say_refuses_a_hostile_utterance_naming_the_option(
    args: list[str], expected: str, tmp_path: Path
) -> None:
    text, *rest = args
    res = CliRunner().invoke(app, ["say", text, "--prompt-audio", PROMPT, "--load-format", "dummy",
                                   "-o", str(tmp_path / "x.wav"), *(rest or ["--prompt-text", "words"])])
    assert res.exit_code == 2 and expected in res.output, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    assert not (tmp_path / "x.wav").exists()


def test_the_api_refuses_a_hostile_row_naming_it(tiny_model_dir: Path) -> None:
    from cosyclone import CosyClone
    from cosyclone.errors import CosycloneError

    tts = CosyClone(tiny_model_dir, device="cpu", max_tokens=4, n_timesteps=2)
    with pytest.raises(CosycloneError, match=r"line 1, id 'utt', field 'text': holds a lone surrogate"):
        tts.synthesize("abc\ud800", prompt_audio=PROMPT, prompt_text="words")
    with pytest.raises(CosycloneError, match=r"line 2, id 'b', field 'seed'"):
        tts.synthesize_rows([GOOD[0], {**GOOD[1], "id": "b", "seed": 10**5000}])


def test_a_windows_manifest_validates_and_speaks_the_official_segments(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """CRLF line ends in the file and ``\\r\\n``, ``\\r``, tab, VT, FF inside its texts: the official
    segments.

    The expected segments and ids are the official frontend's (tests/fixtures/text_controls.json,
    see tests/parity/test_text_controls.py); ids are compared where the reference tokenizer is.
    """
    import shutil

    from tests.parity.test_text_controls import CASES, ZS_PROMPT
    from tests.reference import reference_tokenizer

    rows = []
    for k, case in enumerate(CASES):
        row = {"id": f"r{k}", "prompt_audio": PROMPT, "text": case["text"], "mode": case["mode"]}
        if case["mode"] == "zero_shot":
            row["prompt_text"] = case.get("prompt_text") or ZS_PROMPT
        if case.get("instruct"):
            row["instruct"] = case["instruct"]
        rows.append(row)
    path = tmp_path / "windows.jsonl"
    path.write_bytes(b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\r\n" for r in rows))
    assert b"\\r\\n" in path.read_bytes() and path.read_bytes().count(b"\r\n") == len(rows)

    res = CliRunner().invoke(app, ["validate", str(path)])
    assert res.exit_code == 0 and f"{len(rows)} valid rows, 0 rejected" in res.output, res.output

    speak = [0, 1, 7, 9, 12, 14, 15, 17]  # a CRLF deviation, CR, tab, VT, FF, Chinese CRLF
    sub = tmp_path / "speak.jsonl"
    sub.write_bytes(b"".join(json.dumps(rows[k]).encode() + b"\r\n" for k in speak))
    res = CliRunner().invoke(app, ["synth", str(sub), "--model-dir", str(tiny_model_dir), "--out",
                                   str(tmp_path / "out"), *FAST])
    assert res.exit_code == 0, res.output
    records = {
        r["id"]: r for r in map(json.loads, (tmp_path / "out" / "diagnostics.jsonl").read_text().splitlines())
    }
    for k in speak:
        rec = records[f"r{k}"]
        assert rec["status"] == "ok" and rec["text"] == CASES[k]["text"], rec
        assert [s["text"] for s in rec["segments"]] == CASES[k]["segments"], (k, rec["segments"])

    model = tmp_path / "reference-tokenizer-model"  # the tiny layout with the reference tokenizer: real ids
    shutil.copytree(tiny_model_dir, model, ignore=shutil.ignore_patterns("*.pt", "*.onnx"))
    qwen = model / "CosyVoice-BlankEN"  # keeps the tiny config.json (validate reads the geometry, no weights)
    for f in qwen.iterdir():
        if f.name != "config.json":
            f.unlink()
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copy(reference_tokenizer() / name, qwen / name)
    res = CliRunner().invoke(app, ["validate", str(path), "--json", "--model-dir", str(model)])
    assert res.exit_code == 0, res.output
    got = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    assert len(got) == len(rows)
    for case, plan in zip(CASES, got, strict=True):
        assert [s["text"] for s in plan["segments"]] == case["segments"], plan["id"]
        assert [s["ids"] for s in plan["segments"]] == case["segment_ids"], plan["id"]
        if "prompt_ids" in case:
            assert plan["prompt_ids"] == case["prompt_ids"], plan["id"]
