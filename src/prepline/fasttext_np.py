"""A supervised fastText classifier's predictions over a whole Arrow column, in NumPy.

fastText's own batch predict (``multilinePredict``) is a C++ loop, but one document at a time: it
reads each line's words, looks each up in its dictionary, averages the rows of the input matrix and
multiplies by the output matrix. For a linear classifier all of that is vectorisable over the column,
and the per-word work shrinks to one lookup: the score of a document is ``mean over its inputs of
(input row · output matrixᵀ)``, so the (rows × labels) product ``P = input · outputᵀ`` is computed once
per model and each document's logits are a segment mean of ``P``'s rows.

What fastText reads, reproduced from its sources (facebookresearch/fastText, ``src/dictionary.cc``,
``src/model.cc``, ``src/loss.cc``, ``python/fasttext_module/fasttext/FastText.py``):

* ``readWord``: words are the non-empty runs between the bytes `` \\n\\r\\t\\v\\f\\0``; the line's
  final ``\\n`` (the Python binding appends one) is the end-of-sentence word ``</s>``.
* ``getLine``: a word in the dictionary adds its id; a word not in it adds nothing (with ``maxn`` 0);
  a word starting with the label prefix (``__label__``) is a label, not a word. Every word (in the
  dictionary or not, and ``</s>``) adds its hash to the word n-grams.
* ``hash``: 32-bit FNV-1a over the bytes, each byte sign-extended (``int8_t``) before the xor.
* ``addWordNgrams``: for each word i and j = i+1 .. i+n-1: ``h = h * 116049371 + hash[j]`` (uint64),
  id ``nwords + h % bucket``; the hashes were kept as ``int32_t``, so each is sign-extended to 64 bits.
* ``computeHidden``: the mean of the input rows; softmax loss: ``softmax(output · hidden)``;
  one-vs-all and negative sampling: a sigmoid per label, 0 below -8, 1 above 8, else looked up in
  fastText's table of 513 values (so near a step a float rounding can move one value by up to 0.008); ``predict`` reports
  ``exp(log(p + 1e-5))``.

Models this does not cover fall back to fastText's own predict (:func:`for_model` returns None):
character n-grams (``maxn`` > 0), hierarchical softmax, quantized models. The results agree with
fastText's to float rounding (the sums are in float64 here, float32 there; tests/test_fasttext_np.py
checks them within 1e-5 on real text).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prepline.hashing import utf8_bytes
from prepline.textstats import byte_slices

EOS = "</s>"
NGRAM_MUL = np.uint64(116049371)
FNV_OFFSET = np.uint32(2166136261)
FNV_PRIME = np.uint32(16777619)
_SPACE_BYTES = np.zeros(256, dtype=bool)
_SPACE_BYTES[[ord(c) for c in " \n\r\t\v\f\0"]] = True
#: tokens longer than this are hashed one by one (the vectorised loop runs once per byte position)
LONG_TOKEN = 64
#: loss.cc: MAX_SIGMOID 8, SIGMOID_TABLE_SIZE 512 (32 steps per unit); the table is float32 (``real``)
SIGMOID_MAX, SIGMOID_STEPS = 8, 32
_SIGMOID_TABLE = (1.0 / (1.0 + np.exp(-(np.arange(2 * SIGMOID_MAX * SIGMOID_STEPS + 1, dtype=np.float32) * np.float32(2 * SIGMOID_MAX)
                                          / np.float32(512) - np.float32(SIGMOID_MAX))))).astype(np.float32).astype(np.float64)
#: text bytes scored at a time (speed is flat from 1 to 16 MiB; memory grows with it)
CHUNK_BYTES = 4 << 20
#: rows of the input matrix projected at a time (bounds the float64 copy)
PROJECT_ROWS = 1 << 18


def fnv1a(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """fastText's word hash of each token (``data[offsets[i]:offsets[i+1]]``) as uint32."""
    n = len(offsets) - 1
    lengths = np.diff(offsets)
    h = np.full(n, FNV_OFFSET, dtype=np.uint32)
    signed = data.view(np.int8).astype(np.int32).astype(np.uint32)  # int8_t(c) then uint32_t, as fastText
    short = np.flatnonzero(lengths <= LONG_TOKEN)
    order = short[np.argsort(-lengths[short], kind="stable")]  # longest first: the active tokens are a prefix
    sorted_len = lengths[order]
    starts = offsets[:-1][order]
    hs = h[order]
    with np.errstate(over="ignore"):
        for k in range(int(sorted_len[0]) if len(order) else 0):
            m = int(np.searchsorted(-sorted_len, -k, side="left"))  # tokens with length > k
            hs[:m] = (hs[:m] ^ signed[starts[:m] + k]) * FNV_PRIME
        h[order] = hs
    for i in np.flatnonzero(lengths > LONG_TOKEN):
        x = int(FNV_OFFSET)
        for b in signed[offsets[i]:offsets[i + 1]].tolist():
            x = ((x ^ b) * 16777619) & 0xFFFFFFFF
        h[i] = x
    return h


@dataclass
class LinearFastText:
    """A supervised fastText model reduced to what prediction needs."""

    labels: list[str]
    words: pa.Array  # the dictionary's words, by id
    proj: np.ndarray  # (labels, nwords + bucket) float64: output matrix · input rowᵀ, one contiguous row per label
    word_ngrams: int
    bucket: int
    label_prefix: str
    sigmoid: bool  # one-vs-all / negative sampling (else softmax)

    @property
    def nwords(self) -> int:
        return len(self.words)

    def _tokens(self, lines: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """fastText's words of each line, flattened: (document, dictionary id or -1, is a word (not a
        label), hash, is ``</s>``). Arrow's ASCII white space is fastText's set but for NUL, which becomes a space
        first; each distinct token is looked up and hashed once (a column repeats its words)."""
        parts = pc.ascii_split_whitespace(pc.replace_substring(lines, "\0", " "))
        flat, doc = parts.flatten(), pc.list_parent_indices(parts)
        keep = pc.greater(pc.binary_length(flat), 0)
        flat, doc = flat.filter(keep), doc.filter(keep).to_numpy().astype(np.int64)
        enc = pc.dictionary_encode(flat)
        codes = enc.indices.to_numpy()
        uniq = enc.dictionary.cast(pa.large_string())
        ids = pc.fill_null(pc.index_in(uniq, value_set=self.words), -1).to_numpy().astype(np.int64)
        word = ~np.asarray(pc.starts_with(uniq, self.label_prefix).to_numpy(zero_copy_only=False), dtype=bool)
        hashes = fnv1a(*utf8_bytes(uniq))
        eos = pc.index(uniq, EOS).as_py()
        if eos is not None and eos >= 0:  # getLine stops at a </s> in the text: what follows it is not read
            at = np.flatnonzero(codes == eos)
            first = np.full(len(lines), np.iinfo(np.int64).max)
            np.minimum.at(first, doc[at], at)
            keep = np.arange(len(doc)) <= first[doc]
            doc, codes = doc[keep], codes[keep]
        return doc, ids[codes], word[codes], hashes[codes], codes == (eos if eos is not None else -1)

    def proba(self, lines: pa.Array) -> np.ndarray:
        """(documents, labels) probabilities as fastText's predict reports them, for one-line texts;
        scored in slices of about CHUNK_BYTES of text, so that the token arrays (~40 bytes per token)
        stay bounded whatever the batch: a 25,000-document batch took the worker to 1.28 GB."""
        if isinstance(lines, pa.ChunkedArray):
            lines = lines.combine_chunks()
        parts = byte_slices(lines, CHUNK_BYTES)
        if len(parts) == 1:
            return self._proba(lines)
        return np.concatenate([self._proba(lines.slice(a, b - a)) for a, b in parts])

    def _proba(self, lines: pa.Array) -> np.ndarray:
        n = len(lines)
        doc, ids, is_word, hashes, is_eos = self._tokens(lines)
        word_doc, word_ids, word_hash = doc[is_word], ids[is_word], hashes[is_word]
        # every line ends with </s> (a word, hashed; in the dictionary if training saw line ends),
        # but for a line that had one in its text (it ended there)
        ended = np.zeros(n, dtype=bool)
        ended[doc[is_eos]] = True
        to_end = np.flatnonzero(~ended)
        pos = np.searchsorted(word_doc, to_end, side="right")  # after each document's last word
        word_doc = np.insert(word_doc, pos, to_end)
        word_ids = np.insert(word_ids, pos, self._eos_id)
        # getLine keeps the hashes as int32_t and addWordNgrams widens them to uint64_t: sign-extended
        word_hash = np.insert(word_hash, pos, self._eos_hash).view(np.int32).astype(np.int64).view(np.uint64)
        inputs_doc = [word_doc[word_ids >= 0]]
        inputs_id = [word_ids[word_ids >= 0]]
        h = word_hash
        with np.errstate(over="ignore"):
            for k in range(1, self.word_ngrams):
                if len(word_hash) <= k:
                    break
                h = h[:-1] * NGRAM_MUL + word_hash[k:]
                same = word_doc[:-k] == word_doc[k:]
                inputs_doc.append(word_doc[:-k][same])
                inputs_id.append((self.nwords + (h[same] % np.uint64(self.bucket))).astype(np.int64))
        idx_doc = np.concatenate(inputs_doc)
        idx = np.concatenate(inputs_id)
        count = np.bincount(idx_doc, minlength=n).astype(np.float64)
        logits = np.empty((n, len(self.labels)), dtype=np.float64)
        for j in range(len(self.labels)):
            logits[:, j] = np.bincount(idx_doc, weights=self.proj[j][idx], minlength=n)
        with np.errstate(invalid="ignore", divide="ignore"):
            logits /= count[:, None]
        if self.sigmoid:  # loss.cc sigmoid(): a 513-entry table over [-8, 8], the index truncated
            slot = ((np.clip(np.nan_to_num(logits), -SIGMOID_MAX, SIGMOID_MAX) + SIGMOID_MAX) * SIGMOID_STEPS).astype(np.int64)
            p = np.where(logits < -SIGMOID_MAX, 0.0, np.where(logits > SIGMOID_MAX, 1.0, _SIGMOID_TABLE[slot]))
        else:
            e = np.exp(logits - logits.max(axis=1, keepdims=True))
            p = e / e.sum(axis=1, keepdims=True)
        p = p + 1e-5  # fastText's std_log(p) = log(p + 1e-5), reported as exp of it
        p[count == 0] = 0.0  # fastText predicts nothing for a line without inputs
        return p

    def __post_init__(self) -> None:
        found = pc.index(self.words, EOS).as_py()
        self._eos_id = found if found is not None and found >= 0 else -1
        self._eos_hash = fnv1a(np.frombuffer(EOS.encode(), np.uint8), np.array([0, len(EOS)]))[0]


def for_model(model) -> LinearFastText | None:
    """The vectorised form of a loaded ``fasttext`` model, or None when it uses what this does not
    reproduce (character n-grams, hierarchical softmax, quantization): fastText's predict then."""
    import fasttext

    args = model.f.getArgs()
    if model.is_quantized() or args.maxn > 0 or args.model != fasttext.FastText.model_name.supervised:
        return None
    loss = args.loss
    names = fasttext.FastText.loss_name
    if loss not in (names.softmax, names.ova, names.ns):
        return None
    words = pa.array([str(w) for w in model.get_words()], pa.large_string())
    inp = model.get_input_matrix()
    out = model.get_output_matrix().astype(np.float64)
    if inp.shape[0] != len(words) + args.bucket:
        return None
    proj = np.empty((out.shape[0], inp.shape[0]), dtype=np.float64)
    for a in range(0, inp.shape[0], PROJECT_ROWS):
        proj[:, a:a + PROJECT_ROWS] = out @ inp[a:a + PROJECT_ROWS].astype(np.float64).T
    return LinearFastText(labels=[str(x) for x in model.get_labels()], words=words, proj=proj, word_ngrams=int(args.wordNgrams),
                          bucket=int(args.bucket), label_prefix=str(args.label), sigmoid=loss != names.softmax)
