"""`infer gate`: anchors schema and errors, hashing, blessing round-trip, near-tie analysis, JUnit, and
real-model runs in separate processes (hash stability, drift detection, --bless restoring the file)."""

from __future__ import annotations

import hashlib
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from cli_process import ROOT, infer_cli

from infer.cli.fingerprint import environment_fingerprint, fingerprint_diff
from infer.cli.gate.anchors import (
    Blessing,
    GateFileError,
    bless_document,
    dump_document,
    load_anchors,
    token_hash,
)
from infer.cli.gate.check import AnchorResult, AnchorRun, find_divergence, relative_gap, write_junit

SHIPPED = ROOT / "anchors" / "default.yaml"


def write(tmp_path: Path, text: str, name: str = "anchors.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# -- hashing ------------------------------------------------------------------------------------------
def test_token_hash_is_sha256_of_comma_joined_decimal_ids() -> None:
    assert token_hash([7042, 30, 198]) == hashlib.sha256(b"7042,30,198").hexdigest()
    assert token_hash([]) == hashlib.sha256(b"").hexdigest()


def test_shipped_anchors_are_valid_and_cover_the_required_kinds() -> None:
    loaded = load_anchors(SHIPPED)
    anchors = loaded.anchors
    assert len(anchors) >= 6
    assert any(a.greedy and a.anchor.prompt and not a.anchor.chat for a in anchors)
    assert any(a.anchor.messages or a.anchor.chat for a in anchors)
    temps = {a.sampler["temperature"] for a in anchors if not a.greedy}
    assert len(temps) >= 2 and all(a.sampler.get("seed") is not None for a in anchors if not a.greedy)
    assert any(a.n_predict >= 256 for a in anchors)
    assert any(a.anchor.stop for a in anchors)
    for a in anchors:
        expect = a.anchor.expect
        assert expect is not None and expect.sha256 and expect.token_ids is not None
        assert token_hash(expect.token_ids) == expect.sha256, a.name
    # The documented serialization is in the file header.
    assert 'sha256(b"7042,30,198")' in SHIPPED.read_text()


# -- bad files: exit 2 naming the key path -------------------------------------------------------------
GOOD = """\
version: 1
anchors:
  - name: a
    prompt: "Hello"
    sampler: {temperature: 0}
    n_predict: 4
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("anchors: [", "not valid YAML"),
        ("- just a list\n", "a mapping with an `anchors:` list"),
        (GOOD.replace("n_predict: 4", "n_predict: 0"), ":6: anchors[0].n_predict: must be greater than"),
        (GOOD.replace("prompt:", "promt:"), "anchors[0].promt: unknown key 'promt' (did you mean 'prompt'?)"),
        (GOOD.replace("{temperature: 0}", "{temperature: 0.8}"), "anchors[0].sampler.seed: a sampled anchor"),
        (GOOD.replace("{temperature: 0}", "{top_k: 3}"), "anchors[0].sampler.temperature: required"),
        (GOOD.replace("{temperature: 0}", "{temperature: 0, top_p: 1.5}"), "anchors[0].sampler.top_p"),
        (GOOD.replace("{temperature: 0}", "{temperature: 0, tmep: 1}"), "anchors[0].sampler.tmep: unknown"),
        (
            GOOD + '  - name: a\n    prompt: "x"\n    sampler: {temperature: 0}\n',
            "anchors[1].name: duplicate",
        ),
        (GOOD.replace('prompt: "Hello"', 'prompt: "Hello"\n    messages: []'), "exactly one of `prompt`"),
        (GOOD + "    expect: {sha256: nothex}\n", "anchors[0].expect.sha256"),
        ("version: 1\nanchors: []\n", "anchors: "),
    ],
)
def test_bad_anchors_file_names_the_key_path(tmp_path: Path, text: str, expected: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(GateFileError) as info:
        load_anchors(path)
    message = str(info.value)
    assert message.startswith(str(path)), message
    assert expected in message, message
    assert "\n" not in message


def test_cli_bad_file_exits_2_with_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD.replace("n_predict: 4", "n_predict: -3"))
    result = infer_cli("gate", str(path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "anchors[0].n_predict" in lines[0], result.stderr
    assert result.stdout == ""


def test_cli_rejects_sampler_flags(tmp_path: Path) -> None:
    result = infer_cli("gate", str(write(tmp_path, GOOD)), "--temp", "0.5")
    assert result.returncode == 2 and "--temp" in result.stderr


def test_filter_selects_by_substring_and_glob() -> None:
    loaded = load_anchors(SHIPPED)
    assert [a.name for a in loaded.select(["greedy"])] == [
        a.name for a in loaded.anchors if "greedy" in a.name
    ]
    assert {a.name for a in loaded.select(["seeded-*"])} == {
        a.name for a in loaded.anchors if a.name.startswith("seeded-")
    }


# -- blessing round-trip ---------------------------------------------------------------------------------
COMMENTED = """\
# header comment
version: 1
defaults:
  model: null   # the default model
  n_predict: 4

anchors:
  # first anchor
  - name: one
    prompt: "Hello"
    sampler: {temperature: 0}

  # second anchor, introduced by this comment
  - name: two
    prompt: "World"
    sampler: {temperature: 0.5, seed: 7}   # seeded
"""


def test_bless_preserves_comments_order_and_null(tmp_path: Path) -> None:
    loaded = load_anchors(write(tmp_path, COMMENTED))
    fresh = Blessing(token_hash([1, 2, 3]), 3, "length", 2, {}, [1, 2, 3], [0.5, 0.0001, None])
    report = bless_document(loaded, {0: fresh, 1: fresh}, keep_tokens=True, fingerprint={"python": "3.x"})
    text = dump_document(loaded.document)
    for comment in ("# header comment", "# the default model", "# first anchor", "# seeded"):
        assert comment in text
    assert "model: null" in text
    # The comment that introduces anchor two still sits right before it, not inside anchor one's expect.
    lines = text.splitlines()
    assert lines[lines.index("  - name: two") - 1] == "  # second anchor, introduced by this comment"
    assert "token_ids: [1, 2, 3]" in text and "top2_gaps: [0.5, 0.0001, null]" in text
    assert report[0][0] == "one" and any("sha256" in change for change in report[0][1])
    again = yaml.safe_load(text)
    assert again["anchors"][1]["expect"]["sha256"] == token_hash([1, 2, 3])
    assert again["fingerprint"] == {"python": "3.x"}
    # Blessing the same results again changes nothing.
    path = write(tmp_path, text, "again.yaml")
    reloaded = load_anchors(path)
    assert all(
        not changes
        for _, changes in bless_document(reloaded, {0: fresh, 1: fresh}, keep_tokens=True, fingerprint=None)
    )


# -- divergence and near-ties ---------------------------------------------------------------------------
def fake_run(ids: list[int], top2: list[tuple[tuple[int, float], ...]]) -> AnchorRun:
    return AnchorRun(tuple(ids), tuple(top2), "", "length", 3, {}, 0.1)


def decode(ids: list[int]) -> str:
    return "".join(f"<{i}>" for i in ids)


def test_relative_gap_is_the_relative_probability_difference() -> None:
    assert relative_gap(0.0) == 0.0
    assert relative_gap(1e-4) == pytest.approx(1e-4, rel=1e-3)
    assert relative_gap(2.0) == pytest.approx(1 - 0.1353352832366127)


def test_divergence_at_a_near_tie_is_flagged() -> None:
    expected = [5, 6, 7, 8]
    stored_gaps = [1.0, 2.0, 0.0002, 1.5]
    run = fake_run(
        [5, 6, 9, 10],
        [((5, -0.1), (1, -1.1)), ((6, -0.1), (2, -2.1)), ((9, -0.69), (7, -0.6902)), ((10, -0.1), (3, -1.0))],
    )
    d = find_divergence(expected, stored_gaps, run, greedy=True, tie_margin=1e-3, decode=decode)
    assert d is not None and d.position == 2
    assert (d.expected_token, d.produced_token, d.produced_runner_up) == (7, 9, 7)
    assert d.near_tie is True
    assert d.prefix_text == "<5><6>" and d.expected_text == "<7><8>" and d.produced_text == "<9><10>"


def test_divergence_with_a_clear_winner_is_not_a_tie() -> None:
    run = fake_run([5, 9], [((5, -0.1), (1, -1.1)), ((9, -0.1), (7, -3.0))])
    d = find_divergence([5, 7], [1.0, 2.5], run, greedy=True, tie_margin=1e-3, decode=decode)
    assert d is not None and d.near_tie is False


def test_tie_needs_the_expected_token_as_runner_up_when_only_this_run_has_gaps() -> None:
    swapped = fake_run([9], [((9, -0.6931), (7, -0.6932))])
    other = fake_run([9], [((9, -0.6931), (4, -0.6932))])
    assert find_divergence([7], None, swapped, greedy=True, tie_margin=1e-3, decode=decode).near_tie is True
    assert find_divergence([7], None, other, greedy=True, tie_margin=1e-3, decode=decode).near_tie is False


def test_sampled_anchors_get_no_tie_verdict_and_prefixes_diverge_at_the_end() -> None:
    run = fake_run([5, 6], [((5, -0.1), (1, -0.1001)), ((6, -0.1), (2, -0.1001))])
    d = find_divergence([5, 6, 7], [0.0, 0.0, 0.0], run, greedy=False, tie_margin=1e-3, decode=decode)
    assert d is not None and d.position == 2 and d.produced_token is None and d.near_tie is None
    assert find_divergence([5, 6], None, run, greedy=True, tie_margin=1e-3, decode=decode) is None


def test_junit_report_lists_every_anchor(tmp_path: Path) -> None:
    results = [
        AnchorResult("ok-one", "pass", {}, {}, 0.5),
        AnchorResult("drift", "fail", {}, {}, 0.7, problems=["sha256 a… expected, got b…"]),
        AnchorResult("tied", "tie", {}, {}, 0.2, problems=["sha256 differs"]),
        AnchorResult("broken", "error", {}, {}, 0.1, problems=["generation failed: boom"]),
    ]
    path = tmp_path / "out" / "report.xml"
    write_junit(path, results, suite="default", allow_ties=True, seconds=1.5)
    root = ET.parse(path).getroot()
    suite = root.find("testsuite")
    assert (
        suite is not None
        and suite.get("tests") == "4"
        and suite.get("failures") == "1"
        and suite.get("errors") == "1"
    )
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    assert list(cases) == ["ok-one", "drift", "tied", "broken"]
    assert cases["drift"].find("failure") is not None
    assert cases["tied"].find("failure") is None and "tie-only" in (
        cases["tied"].findtext("system-out") or ""
    )
    assert cases["broken"].find("error") is not None


def test_fingerprint_has_the_documented_fields_and_diffs_by_key() -> None:
    fp = environment_fingerprint(
        backend="cpu", profile_name="cpu", profile_path=ROOT / "profiles" / "cpu.yaml"
    )
    assert fp["python"] and fp["numpy"] and fp["backend"] == "cpu" and fp["cpu"]["cores"]
    assert fp["profile"]["sha256"] and fp["infer"]["version"]
    assert fp["blas"] and {"vendor", "threads", "architecture"} <= set(fp["blas"][0])
    changed = json.loads(json.dumps(fp))
    changed["blas"][0]["threads"] = 99
    changed["cpu"]["model"] = "Other CPU"
    keys = [key for key, _, _ in fingerprint_diff(fp, changed)]
    assert keys == ["blas[0].threads", "cpu.model"]
    half = environment_fingerprint(
        backend="cpu", profile_name="cpu", profile_path=ROOT / "profiles" / "cpu.yaml", kv_cache_dtype="f16"
    )
    assert fingerprint_diff(fp, half) == [("kv_cache_dtype", None, "f16")]


# -- real model, separate processes ----------------------------------------------------------------------
SMALL = """\
# small anchors for the tests
version: 1
defaults:
  n_predict: 12

anchors:
  # greedy
  - name: greedy
    prompt: "The capital of France is"
    sampler: {temperature: 0}
    ignore_eos: true

  # seeded
  - name: seeded
    prompt: "Once upon a time"
    sampler: {temperature: 0.9, seed: 99}
    n_predict: 6
"""


@pytest.mark.real_model
@pytest.mark.slow
def test_shipped_anchors_pass_with_junit_and_json(tmp_path: Path, default_model_path: Path) -> None:
    junit = tmp_path / "gate.xml"
    result = infer_cli("gate", str(SHIPPED), "--json", "--junit", str(junit))
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    names = [a.name for a in load_anchors(SHIPPED).anchors]
    assert payload["ok"] is True and [a["name"] for a in payload["anchors"]] == names
    assert all(a["status"] == "pass" for a in payload["anchors"])
    assert payload["fingerprint"]["blas"]
    cases = [case.get("name") for case in ET.parse(junit).getroot().iter("testcase")]
    assert cases == names


@pytest.mark.real_model
@pytest.mark.slow
def test_drift_is_caught_reported_and_blessed_back(tmp_path: Path, default_model_path: Path) -> None:
    path = write(tmp_path, SMALL)
    # Process 1: bless (with token ids and gaps).
    blessed = infer_cli("gate", str(path), "--bless", "--keep-tokens")
    assert blessed.returncode == 0, blessed.stderr
    # Without --json the human report is the command's output (stdout); with it, it moves to stderr.
    assert "greedy: sha256 (none) ->" in " ".join(blessed.stdout.split())
    blessed_text = path.read_text()
    assert "# greedy" in blessed_text and "# seeded" in blessed_text and "fingerprint:" in blessed_text

    # Process 2: the same hashes in a fresh process.
    again = infer_cli("gate", str(path), "--json")
    assert again.returncode == 0, again.stderr + again.stdout
    assert [a["status"] for a in json.loads(again.stdout)["anchors"]] == ["pass", "pass"]

    # Change one stored token id where the model is sure (largest gap): a real drift, not a tie.
    data = yaml.safe_load(blessed_text)
    expect = data["anchors"][0]["expect"]
    position = max(range(len(expect["top2_gaps"])), key=lambda i: expect["top2_gaps"][i])
    expect["token_ids"][position] = (expect["token_ids"][position] + 1) % 1000 + 100
    expect["sha256"] = token_hash(expect["token_ids"])
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    drift = infer_cli("gate", str(path), "--json")
    assert drift.returncode == 1
    report = json.loads(drift.stdout)
    greedy = report["anchors"][0]
    assert greedy["status"] == "fail" and report["anchors"][1]["status"] == "pass"
    assert greedy["divergence"]["position"] == position and greedy["divergence"]["near_tie"] is False
    assert f"first divergence at token {position}" in drift.stderr and "not a near-tie" in drift.stderr

    # The same change where the stored gap says the two best tokens were tied: a tie, allowed on request.
    expect["top2_gaps"][position] = 1e-6
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    tie = infer_cli("gate", str(path), "--json", "--allow-ties", "--filter", "greedy")
    assert tie.returncode == 0, tie.stderr
    assert json.loads(tie.stdout)["anchors"][0]["status"] == "tie"
    assert "a near-tie" in tie.stderr

    # --bless restores the expectations exactly (and says what it changed).
    data = yaml.safe_load(blessed_text)
    data["anchors"][0]["expect"]["token_ids"][0] += 1
    data["anchors"][0]["expect"]["sha256"] = "0" * 64
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    restore = infer_cli("gate", str(path), "--bless", "--filter", "greedy")
    assert restore.returncode == 0, restore.stderr
    assert "greedy: sha256 000000000000… ->" in " ".join(restore.stdout.split())
    restored, original = yaml.safe_load(path.read_text())["anchors"], yaml.safe_load(blessed_text)["anchors"]
    # Gaps are diagnostics, not hashed: float noise in the last stored digits is allowed.
    for new, old in zip(restored, original, strict=True):
        assert new["expect"].pop("top2_gaps") == pytest.approx(old["expect"].pop("top2_gaps"), abs=1e-4)
    assert restored == original


def test_anchors_pin_their_cpu_kernels_below_the_command_line(tmp_path: Path) -> None:
    """The shipped anchors were blessed on `exact`; the product's default mode is `int8`. A file's
    `cpu_kernels` default holds unless the command line or the anchor itself says otherwise, and a mode
    the cpu backend lacks is refused when the file is read."""
    from infer.cli.gate.command import anchor_settings

    path = write(
        tmp_path,
        "version: 1\ndefaults:\n  cpu_kernels: exact\n  sampler: {temperature: 0}\n  n_predict: 4\nanchors:\n"
        "  - name: a\n    prompt: hi\n  - name: b\n    prompt: hi\n    cpu_kernels: blas\n",
    )
    loaded = load_anchors(path)
    first, second = loaded.anchors
    assert anchor_settings(loaded, first, {}).cpu_kernels == "exact"
    assert anchor_settings(loaded, first, {"cpu_kernels": "int8"}).cpu_kernels == "int8"
    assert anchor_settings(loaded, second, {"cpu_kernels": "int8"}).cpu_kernels == "blas"
    bare = write(
        tmp_path,
        "version: 1\ndefaults:\n  sampler: {temperature: 0}\n  n_predict: 4\n"
        "anchors:\n  - name: a\n    prompt: hi\n",
        "bare.yaml",
    )
    loaded_bare = load_anchors(bare)
    assert anchor_settings(loaded_bare, loaded_bare.anchors[0], {}).cpu_kernels == "int8"
    for name in ("default.yaml", "gemma3.yaml"):
        assert yaml.safe_load((ROOT / "anchors" / name).read_text())["defaults"]["cpu_kernels"] == "exact"
    with pytest.raises(GateFileError, match="cpu_kernels"):
        load_anchors(
            write(
                tmp_path,
                "version: 1\ndefaults:\n  cpu_kernels: fast\nanchors:\n  - name: a\n    prompt: hi\n",
                "bad.yaml",
            )
        )
