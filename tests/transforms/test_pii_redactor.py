"""pii_redactor on the real-text sample: planted PII found and replaced, clean text untouched,
modes, prefilter equivalence, offline operation, bad input and parameters."""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from conftest import write_parquet
from prepline import registry
from prepline.engine import RunOptions, run_transform
from prepline.errors import ConfigError, InputError
from prepline.sample import build_sample

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("PRESIDIO_DEVICE", "cpu")

# what the sample plants, one of each kind, plus an IBAN followed by a lower-case word
PLANTED = {
    "EMAIL_ADDRESS": "john.smith@example.com",
    "PHONE_NUMBER": "(212) 555-0123",
    "CREDIT_CARD": "4111-1111-1111-1111",
    "IBAN_CODE": "ES6839836845776004908240",
    "IP_ADDRESS": "192.168.10.254",
}
HANDMADE = [
    f"For questions, email {PLANTED['EMAIL_ADDRESS']} and we will reply within a day.",
    f"Call {PLANTED['PHONE_NUMBER']} for more information. The card {PLANTED['CREDIT_CARD']} was charged twice.",
    f"Donations can be sent to IBAN {PLANTED['IBAN_CODE']} with the reference SAMPLE.",
    f"The server at {PLANTED['IP_ADDRESS']} stopped answering at noon.",
    "",
    "The meeting on 05.08.2015 drew 350.000 people and 1,200 cars.",
]
EMAIL_RX = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
PHONE_CONTEXT = re.compile(r"call|phone|dial|tel|line|number|mobile|cell|whatsapp|hotline|contact", re.I)


def read_dir(root: Path, columns: list[str]) -> pa.Table:
    """All data files under root in sorted order (not metadata.json, not _truth)."""
    files = sorted(p for p in Path(root).rglob("*.parquet") if not any(x.startswith("_") for x in p.relative_to(root).parts))
    return pa.concat_tables([pq.read_table(f, columns=columns) for f in files])


def _transform(**params):
    t = registry.build("pii_redactor", params)
    t.setup(None)
    return t


def _run_table(t, texts: list[str]) -> tuple[list[str], list[list[str]], dict]:
    out = t.transform(pa.table({"contents": pa.array(texts, pa.string())}), None)
    table = out.parts[""]
    return table["contents"].to_pylist(), table["detected_pii"].to_pylist(), out.counters


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pii") / "sample"
    build_sample(root, docs=2000, seed=11, files=4)
    return root


@pytest.fixture(scope="module")
def redacted(sample) -> dict:
    out = sample.parent / "w1"
    meta = run_transform("pii_redactor", {}, RunOptions(str(sample), str(out), workers=1, progress=False)).metadata
    before = read_dir(sample, ["sample_id", "contents"])
    after = read_dir(out, ["sample_id", "contents", "detected_pii"])
    truth = pq.read_table(sample / "_truth" / "docs.parquet")
    return {"out": out, "meta": meta, "before": before, "after": after, "truth": {r["sample_id"]: r for r in truth.to_pylist()}}


@pytest.mark.slow  # Presidio and spaCy take seconds to set up
def test_every_planted_item_is_replaced_and_typed(redacted):
    before = dict(zip(redacted["before"]["sample_id"].to_pylist(), redacted["before"]["contents"].to_pylist()))
    after = {r["sample_id"]: r for r in redacted["after"].to_pylist()}
    planted = found = 0
    kinds = set()
    for sid, tr in redacted["truth"].items():
        for value, kind in zip(tr["pii"] or [], tr["pii_types"] or []):
            planted += 1
            kinds.add(kind)
            assert value in before[sid]
            assert value not in after[sid]["contents"], (kind, value)
            assert f"<{kind}>" in after[sid]["contents"]
            assert kind in after[sid]["detected_pii"], (kind, value, after[sid]["detected_pii"])
            found += 1
    assert planted >= 20 and found == planted  # recall 1.0
    assert kinds == set(PLANTED)


@pytest.mark.slow  # Presidio and spaCy take seconds to set up
def test_text_without_pii_is_unchanged_except_real_contact_details(redacted):
    """Docs with no planted PII keep their bytes, unless they hold a real e-mail or a phone number
    announced by a context word (news articles do: 'Contact the writer at x@chinadaily.com.cn')."""
    before = dict(zip(redacted["before"]["sample_id"].to_pylist(), redacted["before"]["contents"].to_pylist()))
    clean = unchanged = real = 0
    for r in redacted["after"].to_pylist():
        if redacted["truth"][r["sample_id"]]["pii"]:
            continue
        clean += 1
        old, new = before[r["sample_id"]], r["contents"]
        if old == new:
            unchanged += 1
            assert r["detected_pii"] == []
            continue
        real += 1
        assert set(r["detected_pii"]) <= {"EMAIL_ADDRESS", "PHONE_NUMBER"}, r["detected_pii"]
        # every replaced piece is a real e-mail, or digits right after a phone context word
        rebuilt = EMAIL_RX.sub("<EMAIL_ADDRESS>", old)
        if "PHONE_NUMBER" not in r["detected_pii"]:
            assert rebuilt == new
        else:
            pieces = new.split("<PHONE_NUMBER>")
            pos = 0
            for left, right in zip(pieces, pieces[1:]):
                left_old = left.replace("<EMAIL_ADDRESS>", "")
                pos = old.find(left_old[-40:], pos) + len(left_old[-40:]) if left_old else pos
                nxt = old.find(right.replace("<EMAIL_ADDRESS>", "")[:20], pos)
                number = old[pos:nxt]
                assert sum(ch.isdigit() for ch in number) >= 6, number
                assert PHONE_CONTEXT.search(old[max(0, pos - 60) : pos]), old[max(0, pos - 60) : nxt]
    assert clean > 1500 and unchanged / clean > 0.97, (unchanged, clean, real)


@pytest.mark.slow  # Presidio and spaCy take seconds to set up
def test_counters_add_up(redacted):
    t = redacted["meta"]["totals"]
    c = t["counters"]
    detected = redacted["after"]["detected_pii"].to_pylist()
    assert t["docs_in"] == t["docs_out"] == redacted["after"].num_rows and not t["removed"]
    for kind in PLANTED:
        assert c[f"pii_{kind}"] == sum(d.count(kind) for d in detected) > 0
    assert c["pii_docs"] == sum(1 for d in detected if d)
    assert c["pii_docs"] <= c["pii_analyzed_docs"] <= c["pii_candidate_docs"] < t["docs_in"]


@pytest.mark.slow  # Presidio and spaCy take seconds to set up
def test_same_result_as_plain_presidio_on_whole_documents(redacted):
    """Prefilter, scan and region analysis change nothing: the output equals Presidio's
    BatchAnalyzerEngine + AnonymizerEngine run on every whole document, and prefilter on/off agree."""
    from presidio_analyzer import BatchAnalyzerEngine
    from presidio_anonymizer import AnonymizerEngine

    from prepline.transforms.pii_redactor import DEFAULT_ENTITIES

    before = redacted["before"]
    truth = redacted["truth"]
    # the documents that hold digits or '@' (the others cannot hold any default entity), planted ones first
    keep = pc.match_substring_regex(before["contents"], r"[0-9@]").to_pylist()
    rows = [(bool(truth[i]["pii"]), t) for i, t, k in zip(before["sample_id"].to_pylist(), before["contents"].to_pylist(), keep) if k]
    texts = [t for _, t in sorted(rows, key=lambda x: not x[0])][:300]
    t = _transform()
    ours, types, counters = _run_table(t, texts)
    batch, anonymizer = BatchAnalyzerEngine(t._analyzer), AnonymizerEngine()
    plain, plain_types = [], []
    for text, res in zip(texts, batch.analyze_iterator(texts, language="en", entities=DEFAULT_ENTITIES, score_threshold=0.5)):
        out = anonymizer.anonymize(text=text, analyzer_results=res, operators=t._operators) if res else None
        plain.append(out.text if out else text)
        plain_types.append([x.entity_type for x in sorted(out.items, key=lambda x: (x.start, x.end))] if out else [])
    assert ours == plain and types == plain_types
    assert counters["pii_docs"] >= 20
    off = _run_table(_transform(prefilter=False), texts)
    assert off[0] == ours and off[1] == types
    assert counters["pii_candidate_docs"] < off[2]["pii_candidate_docs"] == len([x for x in texts if x])


@pytest.mark.slow  # Presidio and spaCy take seconds to set up
def test_modes_replace_mask_redact():
    rep, rep_types, _ = _run_table(_transform(), HANDMADE)
    assert rep[0] == "For questions, email <EMAIL_ADDRESS> and we will reply within a day."
    assert rep[1] == "Call <PHONE_NUMBER> for more information. The card <CREDIT_CARD> was charged twice."
    assert rep[2] == "Donations can be sent to IBAN <IBAN_CODE> with the reference SAMPLE."  # IBAN before 'with'
    assert rep[3] == "The server at <IP_ADDRESS> stopped answering at noon."
    assert rep[4] == "" and rep[5] == HANDMADE[5]  # dates and amounts are not phone numbers at 0.5
    assert rep_types == [["EMAIL_ADDRESS"], ["PHONE_NUMBER", "CREDIT_CARD"], ["IBAN_CODE"], ["IP_ADDRESS"], [], []]

    masked, mask_types, _ = _run_table(_transform(mode="mask", mask_char="#"), HANDMADE)
    assert mask_types == rep_types
    for old, new in zip(HANDMADE, masked):
        assert len(old) == len(new)
    for value in PLANTED.values():
        assert value not in "".join(masked)
    assert "#" * len(PLANTED["IBAN_CODE"]) in masked[2]

    red, red_types, _ = _run_table(_transform(mode="redact"), HANDMADE)
    assert red_types == rep_types
    assert red[0] == "For questions, email  and we will reply within a day."
    assert red[3] == "The server at  stopped answering at noon."


@pytest.mark.slow  # Presidio and spaCy take seconds to set up
def test_score_threshold_trades_recall_for_false_positives():
    text = "The meeting on 05.08.2015 drew 350.000 people. Lines: 502-574-2111."
    strict, _, _ = _run_table(_transform(), [text])
    loose, loose_types, _ = _run_table(_transform(score_threshold=0.0), [text])
    assert strict == [text]
    assert "PHONE_NUMBER" in loose_types[0] and loose[0] != text


@pytest.mark.slow  # Presidio and spaCy take seconds to set up
def test_unknown_entity_fails_before_any_output(tmp_path):
    write_parquet(tmp_path / "in", "a.parquet", {"contents": ["mail me at a.b@example.com"]})
    with pytest.raises(ConfigError) as e:
        run_transform("pii_redactor", {"entities": ["EMAIL_ADDRESS", "SHOE_SIZE"]}, RunOptions(str(tmp_path / "in"), str(tmp_path / "out"), progress=False))
    assert "SHOE_SIZE" in e.value.message and "EMAIL_ADDRESS" in e.value.fix and "US_SSN" in e.value.fix
    assert not (tmp_path / "out" / "a.parquet").exists()
    with pytest.raises(ConfigError) as e:
        registry.build("pii_redactor", {"entities": ["PERSON"]}).setup(None)
    assert "spacy_model" in e.value.message


@pytest.mark.slow  # Presidio and spaCy take seconds to set up
def test_no_network_is_touched(monkeypatch):
    """Setup and e-mail validation work with every socket connection refused."""

    def refuse(*a, **k):
        raise OSError("network access attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    out, types, _ = _run_table(_transform(entities=["EMAIL_ADDRESS", "URL"]), ["write to x.y@mail.example.org today"])
    assert out == ["write to <EMAIL_ADDRESS> today"] and types == [["EMAIL_ADDRESS"]]


@pytest.mark.slow  # Presidio and spaCy take seconds to set up
def test_document_over_one_megabyte(sample):
    base = " ".join(read_dir(sample, ["contents"])["contents"].to_pylist()[:2000])
    big = (base * (1 + 1_050_000 // max(1, len(base))))[:1_050_000]
    assert len(big.encode()) >= 1_000_000
    doc = big + f" Reach me at {PLANTED['EMAIL_ADDRESS']} now."
    out, types, counters = _run_table(_transform(entities=["EMAIL_ADDRESS"]), [doc, "short one"])
    assert out[0].endswith(" Reach me at <EMAIL_ADDRESS> now.") and "EMAIL_ADDRESS" in types[0]
    assert PLANTED["EMAIL_ADDRESS"] not in out[0] and out[1] == "short one"


@pytest.mark.slow  # Presidio and spaCy take seconds to set up
def test_other_languages_and_tokenizer_fallback():
    t = "Bitte überweisen Sie an DE89 3704 0044 0532 0130 00 oder schreiben Sie an info@beispiel.de, Karte 4111 1111 1111 1111."
    out, types, _ = _run_table(_transform(language="de", entities=["IBAN_CODE", "EMAIL_ADDRESS", "CREDIT_CARD"]), [t])
    assert types == [["IBAN_CODE", "EMAIL_ADDRESS", "CREDIT_CARD"]] and "<IBAN_CODE>" in out[0]
    # Japanese needs an extra tokenizer package for spacy.blank('ja'): the multi-language one is used
    out, types, _ = _run_table(_transform(language="ja", entities=["EMAIL_ADDRESS"]), ["連絡先は taro@example.jp です。"])
    assert out == ["連絡先は <EMAIL_ADDRESS> です。"]


@pytest.mark.slow  # Presidio and spaCy take seconds to set up
def test_spacy_model_from_a_path_adds_ner_entities(tmp_path):
    """The NER path: a local spaCy pipeline (here an entity ruler saved to disk) enables PERSON."""
    import spacy

    nlp = spacy.blank("en")
    nlp.add_pipe("entity_ruler").add_patterns([{"label": "PERSON", "pattern": [{"LOWER": "walcott"}]}])
    nlp.to_disk(tmp_path / "model")
    out, types, _ = _run_table(
        _transform(spacy_model=str(tmp_path / "model"), entities=["PERSON", "EMAIL_ADDRESS"]),
        ["Walcott was born in St. Lucia; mail w@example.com.", "Nothing here."],
    )
    assert out[0] == "<PERSON> was born in St. Lucia; mail <EMAIL_ADDRESS>." and types[0] == ["PERSON", "EMAIL_ADDRESS"]
    assert out[1] == "Nothing here." and types[1] == []
    with pytest.raises(ConfigError) as e:
        _transform(spacy_model=str(tmp_path / "missing"))
    assert "spacy_model" in e.value.message


@pytest.mark.slow  # Presidio and spaCy take seconds to set up
def test_bad_input_is_reported(tmp_path):
    write_parquet(tmp_path / "nulls", "a.parquet", {"contents": pa.array(["a@b.example.com", None], pa.string())})
    with pytest.raises(Exception) as e:
        run_transform("pii_redactor", {}, RunOptions(str(tmp_path / "nulls"), str(tmp_path / "o1"), progress=False))
    assert "null" in str(e.value)
    write_parquet(tmp_path / "noid", "a.parquet", {"text": ["x"]})
    with pytest.raises(InputError) as e:
        run_transform("pii_redactor", {}, RunOptions(str(tmp_path / "noid"), str(tmp_path / "o2"), progress=False))
    assert "contents" in e.value.message and "content_column" in e.value.fix
    write_parquet(tmp_path / "dup", "a.parquet", {"contents": ["x"], "detected_pii": ["y"]})
    with pytest.raises(InputError):
        run_transform("pii_redactor", {}, RunOptions(str(tmp_path / "dup"), str(tmp_path / "o3"), progress=False))


@pytest.mark.parametrize(
    "params, word",
    [
        ({"entities": []}, "entities"),
        ({"entities": ["email_address"]}, "entities"),
        ({"entities": ["URL", "URL"]}, "twice"),
        ({"mask_char": "**"}, "mask_char"),
        ({"mode": "shred"}, "mode"),
        ({"score_threshold": 1.5}, "score_threshold"),
        ({"phone_regions": ["usa"]}, "phone_regions"),
        ({"pii_column": "contents"}, "pii_column"),
        ({"language": "English"}, "language"),
        ({"batch_size": 0}, "batch_size"),
    ],
)
def test_invalid_parameters(params, word):
    with pytest.raises(ConfigError) as e:
        registry.build("pii_redactor", params)
    assert word in str(e.value)


@pytest.mark.slow  # Presidio and spaCy take seconds to set up
def test_metadata_names_the_parameters(redacted):
    m = json.loads((redacted["out"] / "metadata.json").read_text())
    assert m["parameters"]["entities"] == ["EMAIL_ADDRESS", "PHONE_NUMBER", "CREDIT_CARD", "IBAN_CODE", "IP_ADDRESS", "US_SSN"]
    assert m["status"] == "success"


def test_branch_defaults_are_the_recognizers_presidio_has_for_the_language():
    """What a pipeline branch gets (Transform.branch_params, static: the launcher image has no
    Presidio) is checked here against Presidio itself."""
    from prepline.transforms.pii_redactor import DEFAULT_ENTITIES, ENGLISH_ONLY, PiiRedactor, supported_entities

    assert PiiRedactor.branch_params("en") == {} and set(DEFAULT_ENTITIES) <= set(supported_entities("en"))
    for branch, lang in (("ja", "ja"), ("fr", "fr"), ("zh", "zh"), ("other", "xx")):
        p = PiiRedactor.branch_params(branch)
        assert p["language"] == lang and set(p["entities"]) <= set(supported_entities(lang)), branch
        assert not set(ENGLISH_ONLY) & set(supported_entities(lang)), branch  # really English only
    assert PiiRedactor.branch_params("sr-Latn") == {}  # not an ISO 639-1 code: the transform's defaults
