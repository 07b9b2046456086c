"""pii_redactor: find personal data with Presidio's recognizers and replace, mask or remove it.

Offline by construction: the NLP engine is a blank spaCy pipeline (a tokenizer only, no model
to download) wrapped in a small Presidio ``NlpEngine``, and the recognizers are Presidio's
pattern and checksum recognizers (e-mail, phone via ``phonenumbers``, credit card with Luhn,
IBAN with mod-97, IP, URL, US SSN, ...). E-mail validation uses ``tldextract``'s bundled
public-suffix snapshot, never the network. A spaCy NER model can be added with
``spacy_model`` (an installed package name or a path; it is loaded, never downloaded), which
enables Presidio's NER entities (PERSON, LOCATION, ...).

How a table is processed (the hot path is per document only where Presidio needs it):

1. Prefilter (vectorised, ``prefilter=True``): for each requested entity an RE2 regex over the
   whole Arrow column says which documents can hold one at all, e.g. ``@`` for e-mail, 13 digits
   for a card, ``K`` digits separated by at most 4 non-digits for a phone (``K`` is the shortest
   valid number length of the chosen phone regions, from ``phonenumbers``' metadata). Each regex
   accepts a superset of what the recognizer's own patterns accept, so skipping never changes
   the output (a test compares prefilter on and off).
2. Scan (per candidate document): Presidio's analyzer with only the candidate entities and
   empty NLP artifacts (no tokenization) at score threshold 0; context words can only raise the
   score of something already found, so a document without a hit here has none. Phone numbers
   are scanned with ``phonenumbers``' matcher (as Presidio's recognizer does, same regions and
   leniency) on short windows around digit chains only, region by region, skipping chains with
   fewer digits than the region's shortest number: every number the whole-text matcher finds
   lies in such a window.
3. Analyse (documents with a hit): Presidio's full analysis (``BatchAnalyzerEngine``: spaCy
   tokenization in batches, context-word enhancement, ``score_threshold``) for the entity types
   the scan found, on the parts of the document around the scan hits (1,000 characters either
   side, cut at white space; results within 100 characters of a cut are dropped, only a cut can
   put one there). Presidio's results are per type and depend only on the text around an item
   (its match and the 5 words before it), so this equals the whole-document analysis; a test
   compares the output with plain ``BatchAnalyzerEngine`` + ``AnonymizerEngine`` on whole
   documents.
4. Anonymise (documents with a result): ``presidio-anonymizer`` with ``replace``
   (``<EMAIL_ADDRESS>``), ``mask`` (every character of the item becomes ``mask_char``) or
   ``redact`` (removed); overlapping items are merged by the anonymizer.

The text column is rewritten in place (only changed rows are replaced, with
``pc.replace_with_mask``) and ``pii_column`` (default ``detected_pii``) is added: a list of the
entity types of the items that were anonymised, one entry per item in text order (``[]`` when
none), so ``len(detected_pii) = 0`` or ``list_contains(detected_pii, 'EMAIL_ADDRESS')`` work in
the filter stage. Nothing is removed. Counters: ``pii_<TYPE>`` (items per type), ``pii_docs``
(documents with at least one item), ``pii_candidate_docs`` (passed the prefilter), ``pii_analyzed_docs``
(went to the full analysis).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prepline.config import TransformConfig, param
from prepline.errors import ConfigError
from prepline.registry import register
from prepline.transform import Column, FileTask, Output, Transform

DEFAULT_ENTITIES = ["EMAIL_ADDRESS", "PHONE_NUMBER", "CREDIT_CARD", "IBAN_CODE", "IP_ADDRESS", "US_SSN"]
#: default entities Presidio 2.2.366 recognises for English only (the others have a recognizer for any
#: language; tests/transforms/test_pii_redactor.py checks this against Presidio)
ENGLISH_ONLY = ("US_SSN",)
#: the language of a pipeline branch over many languages (spaCy's multi-language tokenizer)
MULTI = "xx"
# Presidio's own default regions for PhoneRecognizer.
DEFAULT_PHONE_REGIONS = ["US", "GB", "DE", "FR", "IL", "IN", "CA", "BR"]
INSTALL_FIX = "install the pii extra: pip install 'prepline[pii]'"

# RE2 regexes (pyarrow.compute): a document can only hold an item of this type if its regex
# matches. Each accepts a superset of the recognizer's patterns (see the comments); \p{Nd}
# because Presidio's patterns run with the `regex` module, whose \d matches any Unicode digit.
_CANDIDATES = {
    # Presidio's e-mail pattern needs a literal '@'
    "EMAIL_ADDRESS": "@",
    # 'All Credit Cards (weak)': 4+3+3+3 digits at least, single [- ] separators
    "CREDIT_CARD": r"\p{Nd}(?:[- ]?\p{Nd}){12}",
    # every IBAN pattern starts with a country code and two check digits (case-sensitive here)
    "IBAN_CODE": r"[A-Z]{2}\p{Nd}{2}",
    # IPv4: four dotted numbers; IPv6: either '::' or at least 6 hex groups with ':'
    "IP_ADDRESS": r"\p{Nd}\.\p{Nd}{1,3}\.\p{Nd}{1,3}\.\p{Nd}|::|(?:[0-9A-Fa-f]{1,4}:){6}",
    # all US SSN patterns: 9 digits with at most one [- .] between digits
    "US_SSN": r"\p{Nd}(?:[- .]?\p{Nd}){8}",
    # Presidio's URL pattern: [a-z0-9.-] then '.<tld>' (case-insensitive)
    "URL": r"(?i)[a-z0-9.\-]\.[a-z]{2}",
}

_MODES = ("replace", "mask", "redact")
# digit chains for the phone scan: Unicode digits separated by at most 4 other characters
_DIGIT_CHAIN = re.compile(r"\d(?:\D{0,4}\d)*")
_PHONE_MARGIN = 40
# the full analysis reads this many characters either side of a scan hit (Presidio's context
# words are the 5 words before an item); results this close to a cut are artefacts of the cut
_CONTEXT_CHARS = 1000
_EDGE_CHARS = 100


@dataclass(frozen=True)
class PiiRedactorConfig(TransformConfig):
    content_column: str = param("contents", "column holding the document text (rewritten in place)")
    entities: list[str] = param(
        DEFAULT_ENTITIES,
        "Presidio entity types to find (checked against the recognizers of the language before any file is read; "
        "e.g. URL, CRYPTO, MAC_ADDRESS, UK_NHS, US_BANK_NUMBER; PERSON/LOCATION need spacy_model)",
    )
    language: str = param("en", "language of the documents (ISO 639-1): selects Presidio's recognizers and the spaCy tokenizer")
    mode: str = param("replace", "replace: '<EMAIL_ADDRESS>'; mask: each character becomes mask_char; redact: remove the item", choices=_MODES)
    mask_char: str = param("*", "character used by mode=mask")
    score_threshold: float = param(
        0.5,
        "keep items whose Presidio score (after context words) is at least this; 0.5 drops bare phone-like numbers "
        "without a context word (score 0.4), which are mostly dates and amounts",
        min=0.0,
        max=1.0,
    )
    phone_regions: list[str] = param(DEFAULT_PHONE_REGIONS, "regions (ISO 3166 alpha-2) whose national phone formats are recognised; '+' numbers are found for any region")
    pii_column: str = param("detected_pii", "column to add: list of the entity types anonymised in the document, in text order")
    spacy_model: str = param("", "optional spaCy pipeline with NER (installed package name or path, never downloaded); '' = blank tokenizer, pattern recognizers only")
    prefilter: bool = param(True, "skip documents that vectorised regexes show cannot hold any requested entity (same output, faster)")
    batch_size: int = param(64, "texts (the parts of documents around scan hits) per spaCy batch in the full analysis", min=1)

    def validate(self) -> None:
        if not self.entities:
            raise ConfigError("entities is empty: pii_redactor would find nothing", f"pass entities, e.g. {DEFAULT_ENTITIES}")
        bad = [e for e in self.entities if not e or e != e.strip().upper() or " " in e]
        if bad:
            raise ConfigError(
                f"entities {bad} are not Presidio entity names (upper case, e.g. EMAIL_ADDRESS)", f"use names such as {', '.join(DEFAULT_ENTITIES)}"
            )
        if len(set(self.entities)) != len(self.entities):
            raise ConfigError(f"entities {list(self.entities)} lists a name twice", "list each entity once")
        if len(self.mask_char) != 1:
            raise ConfigError(f"mask_char={self.mask_char!r} must be exactly one character", "pass e.g. --mask-char '*'")
        if not self.language or not self.language.isalpha() or not self.language.islower() or len(self.language) > 3:
            raise ConfigError(f"language={self.language!r} is not an ISO 639-1 code", "pass a code such as en, de, es")
        if not self.pii_column:
            raise ConfigError("pii_column is empty", "name the column to add, e.g. detected_pii")
        if self.pii_column == self.content_column:
            raise ConfigError("pii_column and content_column are the same", "give pii_column another name")
        if "PHONE_NUMBER" in self.entities:
            bad_r = [r for r in self.phone_regions if len(r) != 2 or not r.isalpha() or not r.isupper()]
            if bad_r or not self.phone_regions:
                raise ConfigError(
                    f"phone_regions {bad_r or []} must be non-empty ISO 3166 alpha-2 codes", f"pass e.g. {DEFAULT_PHONE_REGIONS}"
                )


# ----------------------------------------------------------------------------------------------
# Presidio objects (built in setup, heavy imports here only)


def _make_engine_class():
    import spacy
    from presidio_analyzer.nlp_engine import NlpArtifacts, SpacyNlpEngine

    class BlankOrLocalSpacyEngine(SpacyNlpEngine):
        """Presidio's spaCy engine that never downloads: a blank tokenizer or a local model.

        Lemmas fall back to the lower-cased token text when the pipeline has no lemmatizer, so
        Presidio's context words ('phone', 'card', 'email', ...) still raise scores.
        """

        def __init__(self, language: str, model: str):
            super().__init__(models=[{"lang_code": language, "model_name": model or "blank"}])
            self.language, self.model = language, model
            self.context_words: frozenset[str] = frozenset()

        def is_stopword(self, word: str, language: str) -> bool:
            # spaCy's stop list holds context words such as 'call'; Presidio drops stop words before it
            # looks for context, so 'Call 555-...' would never be boosted
            return word not in self.context_words and super().is_stopword(word, language)

        def load(self) -> None:
            if self.model:
                nlp = spacy.load(self.model)
            else:
                try:
                    nlp = spacy.blank(self.language)
                    nlp("probe")  # some languages (ja, zh, ko, ...) need an extra tokenizer package
                except Exception:
                    nlp = spacy.blank("xx")
            nlp.max_length = 1 << 31  # documents of any length are analysed whole
            self.nlp = {self.language: nlp}

        def _doc_to_nlp_artifact(self, doc, language):
            ents = self._get_entities(doc)
            ents, scores = self._get_updated_entities(ents, self._get_scores_for_entities(doc))
            return NlpArtifacts(
                entities=ents, tokens=doc, tokens_indices=[t.idx for t in doc], lemmas=[t.lemma_ or t.lower_ for t in doc],
                nlp_engine=self, language=language, scores=scores,
            )

        def empty_artifacts(self) -> NlpArtifacts:
            from spacy.tokens import Doc

            return NlpArtifacts(
                entities=[], tokens=Doc(self.nlp[self.language].vocab, words=[]), tokens_indices=[], lemmas=[],
                nlp_engine=self, language=self.language, scores=[],
            )

    return BlankOrLocalSpacyEngine


def build_analyzer(language: str, spacy_model: str = "", phone_regions: list[str] | tuple = DEFAULT_PHONE_REGIONS):
    """An offline Presidio AnalyzerEngine for ``language``; returns (analyzer, engine, ner_entities)."""
    os.environ.setdefault("PRESIDIO_DEVICE", "cpu")  # no CUDA probing through torch at import
    try:
        import regex
        import tldextract
        from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
        from presidio_analyzer.predefined_recognizers import (
            CreditCardRecognizer,
            EmailRecognizer,
            IbanRecognizer,
            PhoneRecognizer,
            SpacyRecognizer,
        )
    except ImportError as e:
        raise ConfigError(f"pii_redactor needs presidio-analyzer, spacy and tldextract ({e})", INSTALL_FIX) from None

    engine = _make_engine_class()(language, spacy_model)
    try:
        engine.load()
    except (OSError, ImportError, ValueError) as e:
        raise ConfigError(
            f"spacy_model={spacy_model!r} cannot be loaded: {str(e).splitlines()[0][:300]}",
            "pass an installed spaCy pipeline package or the path of a saved pipeline (nlp.to_disk), or '' for the blank tokenizer",
        ) from None
    registry = RecognizerRegistry(supported_languages=[language])
    log = logging.getLogger("presidio-analyzer")
    level = log.level
    log.setLevel(logging.ERROR)  # one warning per recognizer of another language otherwise
    try:
        registry.load_predefined_recognizers(languages=[language])
    finally:
        log.setLevel(level)
    registry.recognizers = [r for r in registry.recognizers if not isinstance(r, SpacyRecognizer)]
    ner_entities: list[str] = []
    if spacy_model:
        registry.add_nlp_recognizer(engine)
        ner_entities = sorted({e for r in registry.recognizers if isinstance(r, SpacyRecognizer) for e in r.supported_entities})

    offline_tld = tldextract.TLDExtract(cache_dir=None, suffix_list_urls=())  # bundled snapshot, no network
    have = {e for r in registry.recognizers for e in r.supported_entities}
    if "CREDIT_CARD" not in have:  # Presidio lists it for a few languages only; the Luhn check is universal
        registry.add_recognizer(CreditCardRecognizer(supported_language=language))
    for r in registry.recognizers:
        if isinstance(r, EmailRecognizer):
            # the stock check calls tldextract.extract(), which fetches the suffix list over the network
            r.validate_result = lambda text, _x=offline_tld: _x(text).fqdn != ""
        elif isinstance(r, IbanRecognizer):
            # the registry's global IGNORECASE makes the optional trailing groups of the IBAN pattern swallow
            # lowercase words ('ES68 ... with'), and the IBAN is then lost: IBANs are upper case
            r.global_regex_flags = regex.DOTALL | regex.MULTILINE
        elif isinstance(r, PhoneRecognizer):
            r.supported_regions = tuple(phone_regions)
    engine.context_words = frozenset(w.lower() for r in registry.recognizers for w in (r.context or ()))
    analyzer = AnalyzerEngine(registry=registry, nlp_engine=engine, supported_languages=[language])
    return analyzer, engine, ner_entities


def supported_entities(language: str = "en", spacy_model: str = "") -> list[str]:
    """Entity names the offline analyzer can find for ``language`` (and ``spacy_model``)."""
    analyzer, _, _ = build_analyzer(language, spacy_model)
    return sorted(analyzer.get_supported_entities(language))


_NUMBER_TYPES = (
    "general_desc", "fixed_line", "mobile", "toll_free", "premium_rate", "shared_cost", "personal_number",
    "voip", "pager", "uan", "voicemail", "no_international_dialling",
)


def phone_min_digits(regions) -> dict[str, int]:
    """Per region: fewest digits a phone number that ``phonenumbers`` accepts there can have.

    A national number has at least the shortest possible length of any number type of the region.
    A '+' or IDD-prefixed number of any country is accepted in every region, and has at least
    ``len(country code) + shortest length`` digits over all countries (6 with phonenumbers 9.x), so
    no region needs more digits than that.
    """
    import phonenumbers
    from phonenumbers import PhoneMetadata

    def shortest(md) -> int | None:
        lens = [n for t in _NUMBER_TYPES if getattr(md, t, None) is not None for n in (getattr(md, t).possible_length or ())]
        return min(lens) if lens else None

    intl = []
    for cc, regs in phonenumbers.COUNTRY_CODE_TO_REGION_CODE.items():
        for r in regs:
            md = PhoneMetadata.metadata_for_region_or_calling_code(cc, r)
            k = shortest(md) if md is not None else None
            if k:
                intl.append(len(str(cc)) + k)
    k_intl = min(intl)
    out = {}
    for r in regions:
        md = PhoneMetadata.metadata_for_region(r)
        if md is None:
            raise ConfigError(f"phone_regions: {r!r} is not a region phonenumbers knows", "use ISO 3166 alpha-2 codes such as US, GB, DE")
        out[r] = max(1, min(shortest(md) or 1, k_intl))
    return out


def _digits_regex(k: int) -> str:
    """RE2: ``k`` digits, consecutive ones separated by at most 4 other characters.

    phonenumbers' matcher allows at most 4 punctuation characters between digit blocks, so every
    number it finds with ``k`` or more digits matches this.
    """
    return r"\p{Nd}(?:\P{Nd}{0,4}\p{Nd}){%d}" % (k - 1) if k > 1 else r"\p{Nd}"


def _operators(mode: str, mask_char: str, entity_types):
    from presidio_anonymizer.entities import OperatorConfig

    if mode == "replace":
        return {e: OperatorConfig("replace", {"new_value": f"<{e}>"}) for e in entity_types}
    if mode == "mask":
        cfg = OperatorConfig("mask", {"masking_char": mask_char, "chars_to_mask": 1 << 30, "from_end": False})
        return {e: cfg for e in entity_types}
    return {e: OperatorConfig("redact", {}) for e in entity_types}


@register
class PiiRedactor(Transform):
    name = "pii_redactor"
    Config = PiiRedactorConfig
    summary = "find PII with Presidio's recognizers (offline) and replace, mask or remove it; adds detected_pii"
    headline = ("pii_docs", "pii_*")
    extra = "pii"

    @classmethod
    def branch_params(cls, branch: str) -> dict:
        """Presidio's recognizers for the branch's language (its spaCy tokenizer, its context words),
        with the default entities it has recognizers for; a branch over many languages (other) uses
        the multi-language tokenizer. English keeps the defaults."""
        if branch == "en":
            return {}
        lang = MULTI if branch == "other" else branch
        if not (lang.isalpha() and lang.islower() and len(lang) <= 3):
            return {}
        return {"language": lang, "entities": [e for e in DEFAULT_ENTITIES if e not in ENGLISH_ONLY]}

    def input_columns(self) -> list[Column]:
        return [Column(self.config.content_column, "string")]

    def added_columns(self) -> list[str]:
        return [self.config.pii_column]

    def check_on_driver(self, schema: pa.Schema, where: str) -> None:
        self._build()  # unknown entities, a bad spaCy model or a missing extra fail here, before any batch

    def setup(self, ctx) -> None:
        self._build()

    def _build(self) -> None:
        c = self.config
        analyzer, engine, ner = build_analyzer(c.language, c.spacy_model, c.phone_regions)
        valid = sorted(analyzer.get_supported_entities(c.language))
        unknown = [e for e in c.entities if e not in valid]
        if unknown:
            hint = " (NER entities such as PERSON need spacy_model)" if not c.spacy_model else ""
            raise ConfigError(
                f"entities {unknown} have no recognizer for language '{c.language}'{hint}",
                f"choose from: {', '.join(valid)}",
            )
        from presidio_analyzer import BatchAnalyzerEngine
        from presidio_anonymizer import AnonymizerEngine

        self._analyzer, self._engine = analyzer, engine
        self._batch = BatchAnalyzerEngine(analyzer)
        self._anonymizer = AnonymizerEngine()
        self._operators = _operators(c.mode, c.mask_char, valid)
        self._empty = engine.empty_artifacts()
        # NER entities come from the tokenized document only: such runs skip the scan
        self._needs_nlp = any(e in ner for e in c.entities)
        self._cands = {e: _CANDIDATES.get(e) for e in c.entities if e != "PHONE_NUMBER"}
        self._phone = None
        if "PHONE_NUMBER" in c.entities:
            from presidio_analyzer.predefined_recognizers import PhoneRecognizer

            recs = [r for r in analyzer.registry.recognizers if isinstance(r, PhoneRecognizer) and r.supported_language == c.language]
            if len(recs) == 1:  # the scan calls phonenumbers directly, region by region, like the recognizer does
                import phonenumbers

                mins = phone_min_digits(recs[0].supported_regions)
                self._phone = (phonenumbers, recs[0].leniency, list(mins.items()))
            else:  # an unusual registry: scan with the analyzer, no prefilter
                self._cands["PHONE_NUMBER"] = None

    # ------------------------------------------------------------------------------------------
    def _candidates(self, arr: pa.Array):
        """Which documents may hold which entity: {entity: bool array} and phone regions per document."""
        n = len(arr)
        nonempty = pc.greater(pc.utf8_length(arr), 0).to_numpy(zero_copy_only=False)
        prefilter = self.config.prefilter
        cand: dict[str, np.ndarray] = {}
        for e, rx in self._cands.items():
            if rx is None or not prefilter:
                cand[e] = nonempty
            else:
                m = pc.match_substring(arr, rx) if rx == "@" else pc.match_substring_regex(arr, rx)
                cand[e] = m.to_numpy(zero_copy_only=False) & nonempty
        regions: dict[str, np.ndarray] = {}
        if self._phone is not None:
            memo: dict[int, np.ndarray] = {}
            for region, k in self._phone[2]:
                if k not in memo:
                    memo[k] = pc.match_substring_regex(arr, _digits_regex(k)).to_numpy(zero_copy_only=False) if prefilter else np.ones(n, bool)
                regions[region] = memo[k] & nonempty
        return cand, regions

    def _phone_spans(self, text: str, regions: list[str]) -> list[tuple[int, int]]:
        """Where Presidio's PhoneRecognizer could find a number in ``text`` (for these regions).

        The matcher runs on short windows around each digit chain (digits separated by at most 4
        other characters, the matcher's own limit) with ``_PHONE_MARGIN`` characters either side,
        and only on chains with enough digits for the region. Every number the matcher finds in
        the whole text lies in such a window with the characters it checks around it, so the
        windows returned cover every number the whole-text scan finds (there may be more, which
        only costs analysis).
        """
        phonenumbers, leniency, mins = self._phone
        need = [(r, k) for r, k in mins if r in regions]
        if not need:
            return []
        lowest = min(k for _, k in need)
        spans = []
        for m in _DIGIT_CHAIN.finditer(text):
            digits = sum(ch.isdigit() for ch in m.group())
            if digits < lowest:
                continue
            a, b = max(0, m.start() - _PHONE_MARGIN), m.end() + _PHONE_MARGIN
            window = text[a:b]
            if any(digits >= k and any(True for _ in phonenumbers.PhoneNumberMatcher(window, r, leniency=leniency)) for r, k in need):
                spans.append((a, min(b, len(text))))
        return spans

    def _regions(self, text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Parts of ``text`` to analyse: each span with ``_CONTEXT_CHARS`` either side, cut at white space, merged."""
        n = len(text)
        out: list[list[int]] = []
        for a, b in sorted(spans):
            a, b = max(0, a - _CONTEXT_CHARS), min(n, b + _CONTEXT_CHARS)
            if a > 0:
                k = max(text.rfind(" ", 0, a), text.rfind("\n", 0, a))
                a = k + 1 if k >= 0 else 0
            if b < n:
                ks = [k for k in (text.find(" ", b), text.find("\n", b)) if k >= 0]
                b = min(ks) if ks else n
            if out and a <= out[-1][1]:
                out[-1][1] = max(out[-1][1], b)
            else:
                out.append([a, b])
        return [(a, b) for a, b in out]

    def _analyze_chunk(self, arr: pa.Array, counters: dict[str, int]):
        """Return (new texts for changed rows by index, detected types per row by index)."""
        c = self.config
        cand, regions = self._candidates(arr)
        any_cand = np.zeros(len(arr), dtype=bool)
        for m in list(cand.values()) + list(regions.values()):
            any_cand |= m
        rows = np.flatnonzero(any_cand)
        counters["pii_candidate_docs"] += len(rows)
        if len(rows) == 0:
            return {}, {}
        texts = pc.take(arr, pa.array(rows)).to_pylist()
        # scan: which entity types each candidate document holds, and where (before context words and threshold)
        groups: dict[tuple, list[tuple[int, str, list]]] = {}
        for r, t in zip(rows.tolist(), texts):
            if self._needs_nlp:
                found, spans = tuple(c.entities), [(0, len(t))]
            else:
                want = [e for e in self._cands if cand[e][r]]
                hits = self._analyzer.analyze(t, language=c.language, entities=want, nlp_artifacts=self._empty, score_threshold=0.0) if want else []
                kinds = {h.entity_type for h in hits}
                spans = [(h.start, h.end) for h in hits]
                if regions:
                    phone = self._phone_spans(t, [g for g, m in regions.items() if m[r]])
                    if phone:
                        kinds.add("PHONE_NUMBER")
                        spans.extend(phone)
                found = tuple(e for e in c.entities if e in kinds)
            if found:
                groups.setdefault(found, []).append((r, t, self._regions(t, spans)))
        counters["pii_analyzed_docs"] += sum(len(v) for v in groups.values())
        new_texts: dict[int, str] = {}
        types_by_row: dict[int, list[str]] = {}
        # full analysis of the regions around the hits, only for the entity types the scan found
        # (Presidio's results are per type, and depend only on the text around an item)
        for ents, items in sorted(groups.items(), key=lambda kv: kv[0]):
            pieces = [(i, a, b) for i, (_, t, regs) in enumerate(items) for a, b in regs]
            results = self._batch.analyze_iterator(
                [items[i][1][a:b] for i, a, b in pieces], language=c.language, batch_size=c.batch_size,
                entities=list(ents), score_threshold=c.score_threshold,
            )
            per_doc: dict[int, list] = {}
            for (i, a, b), res in zip(pieces, results):
                n = len(items[i][1])
                for x in res:
                    if (a > 0 and x.start < _EDGE_CHARS) or (b < n and x.end > (b - a) - _EDGE_CHARS):
                        continue  # only a cut can put an item there: the scan hits are far inside
                    x.start += a
                    x.end += a
                    per_doc.setdefault(i, []).append(x)
            for i, res in sorted(per_doc.items()):
                r, t, _ = items[i]
                out = self._anonymizer.anonymize(text=t, analyzer_results=res, operators=self._operators)
                types = [it.entity_type for it in sorted(out.items, key=lambda it: (it.start, it.end))]
                if out.text != t:
                    new_texts[r] = out.text
                types_by_row[r] = types
                for ty in types:
                    counters[f"pii_{ty}"] = counters.get(f"pii_{ty}", 0) + 1
        return new_texts, types_by_row

    def transform(self, table: pa.Table, task: FileTask) -> Output:
        c = self.config
        col = table.column(c.content_column)
        counters = {"pii_candidate_docs": 0, "pii_analyzed_docs": 0, "pii_docs": 0}
        chunks, counts, values = [], np.zeros(table.num_rows, dtype=np.int32), []
        base = 0
        for arr in col.chunks:
            new_texts, found = self._analyze_chunk(arr, counters)
            if new_texts:
                idx = np.array(sorted(new_texts), dtype=np.int64)
                mask = np.zeros(len(arr), dtype=bool)
                mask[idx] = True
                arr = pc.replace_with_mask(arr, pa.array(mask), pa.array([new_texts[i] for i in idx.tolist()], arr.type))
            for i in sorted(found):
                counts[base + i] = len(found[i])
                values.extend(found[i])
            counters["pii_docs"] += len(found)
            chunks.append(arr)
            base += len(arr)
        table = table.set_column(table.column_names.index(c.content_column), c.content_column, pa.chunked_array(chunks, col.type))
        offsets = np.zeros(table.num_rows + 1, dtype=np.int32)
        np.cumsum(counts, out=offsets[1:])
        detected = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.string()))
        return Output.of(table.append_column(c.pii_column, detected), counters=counters)
