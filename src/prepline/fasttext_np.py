"""A supervised fastText classifier's predictions over a whole Arrow column, in one compiled pass.

fastText's own batch predict (``multilinePredict``) is a C++ loop, one document at a time: it reads
each line's words, looks each up in its dictionary, averages the rows of the input matrix and
multiplies by the output matrix. For a linear classifier the multiplication can come first: the
score of a document is ``mean over its inputs of (input row · output matrixᵀ)``, so the
(rows × labels) product ``P = input · outputᵀ`` is computed once per model, and a document's logits
are the mean of ``P``'s rows over its inputs. When only one label's probability is wanted (a
one-vs-all model, or a two-label softmax: ``p = sigmoid(P[:, pos] - P[:, other])``) one column of
``P`` is enough: a few hundred KB that stay in the CPU's cache.

:func:`_sums` (compiled by numba) then reads the column's bytes once: it splits words, hashes each
(FNV-1a) while it reads it, finds it in an open-addressing table of the dictionary (comparing the
bytes, as fastText does), hashes the word n-grams, and adds up ``P``'s rows per document. A
NumPy version of the same (Arrow's split, a dictionary encoding of every word, segment sums) spent
0.9 s of a 25,000-document file in building token arrays; this pass takes about 0.2 s
(docs/transforms/quality_classifier.md).

What fastText reads, reproduced from its sources (facebookresearch/fastText, ``src/dictionary.cc``,
``src/model.cc``, ``src/loss.cc``, ``python/fasttext_module/fasttext/FastText.py``), after the
text is put on one line as :func:`prepline.quality.one_line` does (trimmed; line breaks, including
U+0085, U+2028 and U+2029, to spaces; the same trim and separators are applied here in the pass):

* ``readWord``: words are the non-empty runs between the bytes `` \\n\\r\\t\\v\\f\\0``; the line's
  final ``\\n`` (the Python binding appends one) is the end-of-sentence word ``</s>``.
* ``getLine``: a word in the dictionary adds its id; a word not in it adds nothing (with ``maxn`` 0);
  a word starting with the label prefix (``__label__``) is a label, not a word. Every word (in the
  dictionary or not, and ``</s>``) adds its hash to the word n-grams; a ``</s>`` in the text ends
  the line.
* ``hash``: 32-bit FNV-1a over the bytes, each byte sign-extended (``int8_t``) before the xor.
* ``addWordNgrams``: for each word i and j = i+1 .. i+n-1: ``h = h * 116049371 + hash[j]`` (uint64),
  id ``nwords + h % bucket``; the hashes were kept as ``int32_t``, so each is sign-extended to 64 bits.
* ``computeHidden``: the mean of the input rows; softmax loss: ``softmax(output · hidden)``;
  one-vs-all and negative sampling: a sigmoid per label, 0 below -8, 1 above 8, else looked up in
  fastText's table of 513 values (so near a step a float rounding can move one value by up to 0.008); ``predict`` reports
  ``exp(log(p + 1e-5))``.

Models this does not cover fall back to fastText's own predict (:func:`for_model` returns None):
character n-grams (``maxn`` > 0), hierarchical softmax, quantized models. The results agree with
fastText's to float rounding (``P`` is kept in float32 as fastText's matrices are, the sums are in
float64; tests/framework/test_fasttext_np.py checks them within 1e-5 on real text).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numba
import numpy as np
import pyarrow as pa

from prepline.hashing import utf8_bytes
from prepline.textscan import trim

EOS = "</s>"
NGRAM_MUL = 116049371
FNV_OFFSET, FNV_PRIME = 2166136261, 16777619
#: loss.cc: MAX_SIGMOID 8, SIGMOID_TABLE_SIZE 512 (32 steps per unit); the table is float32 (``real``)
SIGMOID_MAX, SIGMOID_STEPS = 8, 32
_SIGMOID_TABLE = (1.0 / (1.0 + np.exp(-(np.arange(2 * SIGMOID_MAX * SIGMOID_STEPS + 1, dtype=np.float32) * np.float32(2 * SIGMOID_MAX)
                                          / np.float32(512) - np.float32(SIGMOID_MAX))))).astype(np.float32).astype(np.float64)
#: rows of the input matrix projected at a time (bounds the float64 copy)
PROJECT_ROWS = 1 << 18
#: word n-grams longer than this are not hashed by the pass (fastText's -wordNgrams is 1-5 in practice)
MAX_NGRAMS = 16
_MASK32 = np.uint64(0xFFFFFFFF)
_SIGN32 = np.uint64(0xFFFFFFFF00000000)
#: a free slot of the dictionary's table
EMPTY = np.uint64(0xFFFFFFFFFFFFFFFF)
#: per byte: 0 a word's byte, 1 fastText's separator, 2 the lead byte of a line break one_line turns into a space
_BYTE_CLASS = np.zeros(256, dtype=np.uint8)
_BYTE_CLASS[[ord(c) for c in " \n\r\t\v\f\0"]] = 1
_BYTE_CLASS[[0xC2, 0xE2]] = 2
#: the byte a word's hash xors in: sign-extended to 32 bits
_SIGNED_BYTE = np.array([b | 0xFFFFFF00 if b >= 128 else b for b in range(256)], dtype=np.uint64)


@numba.njit(cache=True, nogil=True, inline="always")
def _fnv(data, a, b):
    """fastText's ``hash`` of ``data[a:b]``: FNV-1a over the bytes sign-extended to 32 bits."""
    h = np.uint64(FNV_OFFSET)
    for k in range(a, b):
        c = np.uint64(data[k])
        if c >= 128:
            c |= np.uint64(0xFFFFFF00)
        h = ((h ^ c) * np.uint64(FNV_PRIME)) & _MASK32
    return h


@numba.njit(cache=True, nogil=True, inline="always")
def _widen(h):
    """An ``int32_t`` hash widened to ``uint64_t`` (sign-extended), as addWordNgrams sees it."""
    return h | _SIGN32 if h >= np.uint64(0x80000000) else h


@numba.njit(cache=True, nogil=True, inline="always")
def _sep_len(data, i, end):
    """Bytes of the separator at ``data[i]`` (0 if none): fastText's ASCII separators, and the line
    breaks one_line turns into spaces (U+0085, U+2028, U+2029)."""
    k = _BYTE_CLASS[data[i]]
    if k == 0:
        return 0
    if k == 1:
        return 1
    if data[i] == 0xC2:
        return 2 if i + 1 < end and data[i + 1] == 0x85 else 0
    return 3 if i + 2 < end and data[i + 1] == 0x80 and (data[i + 2] == 0xA8 or data[i + 2] == 0xA9) else 0


@numba.njit(cache=True, nogil=True, inline="always")
def _mod(g, b, m):
    """``g % b`` for uint64 g and b < 2**32 without a division: Barrett's reduction with
    ``m = (2**64 - 1) // b`` (the estimated quotient is short by at most 2)."""
    lo, hi = g & _MASK32, g >> np.uint64(32)
    mlo, mhi = m & _MASK32, m >> np.uint64(32)
    mid = hi * mlo + ((lo * mlo) >> np.uint64(32))
    mid2 = lo * mhi + (mid & _MASK32)
    q = hi * mhi + (mid >> np.uint64(32)) + (mid2 >> np.uint64(32))  # the high 64 bits of g * m
    r = g - q * b
    while r >= b:
        r -= b
    return r


@numba.njit(cache=True, nogil=True)
def _build_table(vdata, voff):
    """An open-addressing table of the dictionary's words by their fastText hash, at most half full:
    a slot is ``hash << 32 | word id`` (one read per probe), ``EMPTY`` when free."""
    n = len(voff) - 1
    size = 2
    while size < 2 * n:
        size *= 2
    table = np.full(size, EMPTY, dtype=np.uint64)
    for w in range(n):
        h = _fnv(vdata, voff[w], voff[w + 1])
        slot = np.int64(h) & (size - 1)
        while table[slot] != EMPTY:
            slot = (slot + 1) & (size - 1)
        table[slot] = (h << np.uint64(32)) | np.uint64(w)
    return table


@numba.njit(cache=True, nogil=True, inline="always")
def _find(data, i, j, h, table, vdata, voff):
    """The dictionary id of the word ``data[i:j]`` with hash ``h``, or -1."""
    mask = len(table) - 1
    slot = np.int64(h) & mask
    ln = j - i
    while table[slot] != EMPTY:
        if (table[slot] >> np.uint64(32)) == h:
            w = np.int64(table[slot] & _MASK32)
            s0 = voff[w]
            if voff[w + 1] - s0 == ln:
                same = True
                for k in range(ln):
                    if vdata[s0 + k] != data[i + k]:
                        same = False
                        break
                if same:
                    return w
        slot = (slot + 1) & mask
    return np.int64(-1)


@numba.njit(cache=True, nogil=True, inline="always")
def _add_ngrams(hist, nh, hh, ngrams, nwords, bucket, bmul, cols, acc):
    """Add the rows of the word n-grams that end with the word of widened hash ``hh`` (after the
    ``nh`` words in ``hist``); returns how many rows were added."""
    added = 0
    for s in range(1, min(nh, ngrams - 1) + 1):  # the n-gram of the words nh-s .. nh
        g = hist[(nh - s) % MAX_NGRAMS]
        for t in range(s - 1, 0, -1):
            g = g * np.uint64(NGRAM_MUL) + hist[(nh - t) % MAX_NGRAMS]
        g = g * np.uint64(NGRAM_MUL) + hh
        r = nwords + np.int64(_mod(g, np.uint64(bucket), bmul))
        for col in range(cols.shape[1]):
            acc[col] += cols[r, col]
        added += 1
    return added


@numba.njit(cache=True, nogil=True)
def _sums(data, offsets, table, vdata, voff, cols, nwords, bucket, ngrams, prefix, eos_id, eos_hash, sums, count, empty):
    """Per document: the sum of ``cols``' rows over its inputs (``sums``), how many (``count``), and
    whether it has no text once trimmed (``empty``)."""
    ncol = cols.shape[1]
    hist = np.zeros(MAX_NGRAMS, dtype=np.uint64)
    acc = np.zeros(ncol, dtype=np.float64)
    eos_wide = _widen(np.uint64(eos_hash))
    bmul = np.uint64(0xFFFFFFFFFFFFFFFF) // np.uint64(max(bucket, 1))
    if bucket <= 0:  # fastText sets bucket 0 when it hashes no n-grams
        ngrams = 1
    for d in range(len(offsets) - 1):
        a, end = trim(data, offsets[d], offsets[d + 1])
        empty[d] = a >= end
        acc[:] = 0.0
        nh = 0
        c = 0
        ended = False
        i = a
        while i < end:
            s = _sep_len(data, i, end)
            if s:
                i += s
                continue
            h = np.uint64(FNV_OFFSET)
            j = i
            while j < end:
                b = data[j]
                if _BYTE_CLASS[b] != 0 and _sep_len(data, j, end) != 0:
                    break
                h = ((h ^ _SIGNED_BYTE[b]) * np.uint64(FNV_PRIME)) & _MASK32
                j += 1
            label = j - i >= len(prefix)
            if label:
                for k in range(len(prefix)):
                    if data[i + k] != prefix[k]:
                        label = False
                        break
            if not label:
                wid = _find(data, i, j, h, table, vdata, voff)
                if wid >= 0:
                    for col in range(ncol):
                        acc[col] += cols[wid, col]
                    c += 1
                hh = _widen(h)
                if ngrams > 1:
                    c += _add_ngrams(hist, nh, hh, ngrams, nwords, bucket, bmul, cols, acc)
                hist[nh % MAX_NGRAMS] = hh
                nh += 1
                if j - i == 4 and data[i] == 60 and data[i + 1] == 47 and data[i + 2] == 115 and data[i + 3] == 62:  # </s>
                    ended = True
                    break
            i = j
        if not ended:  # the line's own end: the word </s>
            if eos_id >= 0:
                for col in range(ncol):
                    acc[col] += cols[eos_id, col]
                c += 1
            if ngrams > 1:
                c += _add_ngrams(hist, nh, eos_wide, ngrams, nwords, bucket, bmul, cols, acc)
        count[d] = c
        for col in range(ncol):
            sums[d, col] = acc[col]


@dataclass
class LinearFastText:
    """A supervised fastText model reduced to what prediction needs."""

    labels: list[str]
    words: pa.Array  # the dictionary's words, by id
    proj: np.ndarray  # (nwords + bucket, labels) float32: input row · output matrixᵀ
    word_ngrams: int
    bucket: int
    label_prefix: str
    sigmoid: bool  # one-vs-all / negative sampling (else softmax)
    _columns: dict = field(default_factory=dict, repr=False)

    @property
    def nwords(self) -> int:
        return len(self.words)

    def __post_init__(self) -> None:
        if self.word_ngrams > MAX_NGRAMS:
            raise ValueError(f"word n-grams of {self.word_ngrams} words (at most {MAX_NGRAMS} are scored here)")
        self._vdata, self._voff = utf8_bytes(self.words)
        self._table = _build_table(self._vdata, self._voff)
        eos = np.frombuffer(EOS.encode(), np.uint8)
        self._eos_hash = int(_fnv(eos, 0, len(eos)))
        self._eos_id = int(_find(eos, 0, len(eos), np.uint64(self._eos_hash), self._table, self._vdata, self._voff))
        self._prefix = np.frombuffer(self.label_prefix.encode(), np.uint8).copy()

    def _sums(self, texts: pa.Array, cols: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if isinstance(texts, pa.ChunkedArray):
            texts = texts.combine_chunks()
        data, offsets = utf8_bytes(texts)
        n = len(texts)
        sums = np.zeros((n, cols.shape[1]), dtype=np.float64)
        count = np.zeros(n, dtype=np.int64)
        empty = np.zeros(n, dtype=np.bool_)
        _sums(data, offsets, self._table, self._vdata, self._voff, cols, self.nwords, self.bucket,
              self.word_ngrams, self._prefix, self._eos_id, np.uint64(self._eos_hash), sums, count, empty)
        return sums, count, empty

    def _activate(self, logits: np.ndarray) -> np.ndarray:
        """fastText's sigmoid (its 513-step table over [-8, 8], the index truncated) of each logit."""
        slot = ((np.clip(np.nan_to_num(logits), -SIGMOID_MAX, SIGMOID_MAX) + SIGMOID_MAX) * SIGMOID_STEPS).astype(np.int64)
        return np.where(logits < -SIGMOID_MAX, 0.0, np.where(logits > SIGMOID_MAX, 1.0, _SIGMOID_TABLE[slot]))

    def proba(self, texts: pa.Array) -> np.ndarray:
        """(documents, labels) probabilities as fastText's predict reports them for each text put on
        one line (an empty text is the line with only ``</s>``)."""
        return self.proba_from(*self._sums(texts, self.proj)[:2])

    def positive(self, texts: pa.Array, label: str) -> tuple[np.ndarray, np.ndarray]:
        """(probability of ``label``, no text) per document. One column of P is summed when one is
        enough (one-vs-all, negative sampling, a two-label softmax), all of them otherwise."""
        j = self.labels.index(label)
        if not self.sigmoid and len(self.labels) > 2:
            sums, count, empty = self._sums(texts, self.proj)
            p = self.proba_from(sums, count)[:, j]
            return p, empty
        if label not in self._columns:
            col = self.proj[:, j].astype(np.float64)
            if not self.sigmoid and len(self.labels) == 2:
                col = col - self.proj[:, 1 - j]  # softmax of two: sigmoid(logit_j - logit_other)
            self._columns[label] = np.ascontiguousarray(col.astype(np.float32)[:, None])
        sums, count, empty = self._sums(texts, self._columns[label])
        with np.errstate(invalid="ignore", divide="ignore"):
            z = sums[:, 0] / count
        if self.sigmoid:
            p = self._activate(z)
        elif len(self.labels) == 2:
            p = 1.0 / (1.0 + np.exp(-np.nan_to_num(z)))
        else:  # a one-label softmax
            p = np.ones_like(z)
        p = p + 1e-5
        p[count == 0] = 0.0
        return p, empty

    def proba_from(self, sums: np.ndarray, count: np.ndarray) -> np.ndarray:
        """Probabilities from the per-document sums of P's rows and their counts."""
        with np.errstate(invalid="ignore", divide="ignore"):
            logits = sums / count[:, None]
        if self.sigmoid:
            p = self._activate(logits)
        else:
            e = np.exp(logits - logits.max(axis=1, keepdims=True)) if len(logits) else logits
            p = e / e.sum(axis=1, keepdims=True)
        p = p + 1e-5  # fastText's std_log(p) = log(p + 1e-5), reported as exp of it
        p[count == 0] = 0.0  # fastText predicts nothing for a line without inputs
        return p


def for_model(model) -> LinearFastText | None:
    """The vectorised form of a loaded ``fasttext`` model, or None when it uses what this does not
    reproduce (character n-grams, hierarchical softmax, quantization): fastText's predict then."""
    import fasttext

    args = model.f.getArgs()
    if model.is_quantized() or args.maxn > 0 or args.model != fasttext.FastText.model_name.supervised:
        return None
    loss = args.loss
    names = fasttext.FastText.loss_name
    if loss not in (names.softmax, names.ova, names.ns) or int(args.wordNgrams) > MAX_NGRAMS:
        return None
    words = pa.array([str(w) for w in model.get_words()], pa.large_string())
    inp = model.get_input_matrix()
    out = model.get_output_matrix().astype(np.float64)
    if inp.shape[0] != len(words) + args.bucket:
        return None
    proj = np.empty((inp.shape[0], out.shape[0]), dtype=np.float32)
    for a in range(0, inp.shape[0], PROJECT_ROWS):
        proj[a:a + PROJECT_ROWS] = inp[a:a + PROJECT_ROWS].astype(np.float64) @ out.T
    return LinearFastText(labels=[str(x) for x in model.get_labels()], words=words, proj=proj, word_ngrams=int(args.wordNgrams),
                          bucket=int(args.bucket), label_prefix=str(args.label), sigmoid=loss != names.softmax)


def warm() -> None:
    """Compile the pass (or load it from numba's cache) on a two-word model: :mod:`prepline.kernels`."""
    for labels, sigmoid in ((["__label__a", "__label__b"], False), (["__label__a", "__label__b", "__label__c"], False), (["__label__a"], True)):
        model = LinearFastText(labels=labels, words=pa.array(["a", EOS], pa.large_string()), proj=np.ones((2 + 7, len(labels)), np.float32),
                               word_ngrams=2, bucket=7, label_prefix="__label__", sigmoid=sigmoid)
        model.proba(pa.array(["a b", ""]))
        model.positive(pa.array(["a b", None]), labels[0])
