"""The training data: fixed-length windows over the Megatron datasets of tokenization outputs.

Each input is a tokenization output (or its ``tokens/`` folder, local or ``s3://``): one Megatron
prefix (``tokens/text_document.bin`` + ``.idx``) whose ``.bin``, read whole, is the input's token
stream (every document followed by its end-of-document id). Window ``k`` of an input is
``stream[k*L : k*L + L + 1]`` (``x = w[:-1]``, ``y = w[1:]``); windows never cross inputs. The
windows of all inputs are numbered one after the other and visited in a permutation per epoch
seeded by ``(seed, epoch)``, so the batch of a step is a function of the step and the seed only.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass

import numpy as np

from prepline.errors import ConfigError, InputError
from prepline.tokens.output import open_tokens, tokens_location


@dataclass
class _Source:
    uri: str
    index: dict  # its index.json
    stream: np.ndarray  # the .bin, memory-mapped locally
    offset: int = 0  # added to every id (mixed_tokenizers='separate')

    @property
    def remote(self) -> bool:
        """Read in ranges through the node's cache (prepline.tokens.cache.RemoteStream)."""
        return hasattr(self.stream, "blocks_of")

    def take(self, start: int, length: int, out: np.ndarray) -> None:
        """``out[:length] = stream[start : start + length] + offset``."""
        out[:length] = self.stream[start : start + length]
        if self.offset:
            out[:length] += self.offset


class TokenData:
    """Fixed-length training windows over the token streams of one or more tokenization outputs."""

    def __init__(self, inputs: list[str], seq_len: int, mixed_tokenizers: str = "error"):
        if not inputs:
            raise ConfigError("no training input given", "pass the tokenization output(s) (paths or s3:// URIs)")
        self.sources = [_Source(uri, *_open(uri)) for uri in inputs]
        shas = list(dict.fromkeys(s.index["tokenizer_sha256"] for s in self.sources))
        if len(shas) > 1 and mixed_tokenizers != "separate":
            listing = "; ".join(f"{s.uri}: {s.index['tokenizer_source']} ({s.index['tokenizer_sha256'][:12]})" for s in self.sources)
            raise ConfigError(
                f"the inputs were tokenized with {len(shas)} different tokenizers ({listing}): their token ids do not mean the same",
                "give every branch the same tokenizer (train one with `prepline tokens train-tokenizer` on all branches and pass its "
                "tokenizer.json as the tokenization stage's 'tokenizer' parameter), train on one language, or pass "
                "mixed_tokenizers='separate' (one vocabulary per tokenizer)",
            )
        self.vocabularies = self._vocabularies(shas)
        self._check_not_empty()
        self.seq_len = L = seq_len
        self.windows = np.array([(s.stream.size - 1) // L if s.stream.size > L else 0 for s in self.sources], np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.windows)]).astype(np.int64)
        self.num_windows = int(self.windows.sum())
        if self.num_windows == 0:
            longest = max(s.stream.size for s in self.sources)
            raise InputError(
                f"the inputs are shorter than one training sequence: the longest holds {longest} tokens, seq_len={L} needs {L + 1}",
                f"lower seq_len (at most {max(longest - 1, 0)}), or give the run more data",
            )
        self.vocab_size = sum(v["vocab_size"] for v in self.vocabularies)
        self.tokenizer_sha256 = shas[0] if len(shas) == 1 else None
        self.eos_id = self.vocabularies[0]["eos_id"] if len(shas) == 1 else None
        self._perm: tuple[int, np.ndarray] | None = None
        self._prefetch: threading.Thread | None = None
        self.wait_seconds = 0.0  # in batch(): what the steps waited for their data

    def _vocabularies(self, shas: list[str]) -> list[dict]:
        """One vocabulary per distinct tokenizer, in input order (a single one: offset 0)."""
        out: list[dict] = []
        for sha in shas:
            group = [s for s in self.sources if s.index["tokenizer_sha256"] == sha]
            offset = sum(v["vocab_size"] for v in out)
            for s in group:
                s.offset = offset
            out.append({"tokenizer_sha256": sha, "offset": offset, "vocab_size": max(int(s.index["vocab_size"]) for s in group),
                        "eos_id": group[0].index["eos_id"], "tokenizer_source": group[0].index["tokenizer_source"],
                        "inputs": [s.uri for s in group]})
        return out

    def _check_not_empty(self) -> None:
        if all(s.stream.size == 0 for s in self.sources):
            docs = sum(int(s.index["num_documents"]) + int(s.index["empty_documents"]) for s in self.sources)
            raise InputError(
                f"no tokens in {', '.join(s.uri for s in self.sources)} ({docs} documents in all, none with a token): "
                "every document was filtered out, or every document is empty",
                "check the filter stage's counts in metadata.json, or give the run more data",
            )

    @property
    def tokens(self) -> int:
        return sum(int(s.stream.size) for s in self.sources)

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for s in self.sources:
            h.update(json.dumps([s.index["tokenizer_sha256"], s.offset, s.index["bin_sha256"], s.index["idx_sha256"]]).encode())
        return h.hexdigest()

    def _locate(self, g: int) -> tuple[_Source, int]:
        """The source of global window ``g`` and the window's first token in it."""
        i = int(np.searchsorted(self.offsets, g, side="right")) - 1
        return self.sources[i], (g - int(self.offsets[i])) * self.seq_len

    def window(self, g: int, out: np.ndarray) -> None:
        src, start = self._locate(g)
        src.take(start, self.seq_len + 1, out)

    def _order(self, epoch: int, seed: int) -> np.ndarray:
        if self._perm is None or self._perm[0] != epoch:
            self._perm = (epoch, np.random.default_rng([seed, epoch]).permutation(self.num_windows))
        return self._perm[1]

    def _windows(self, step: int, batch_size: int, seed: int, part: slice) -> list[int]:
        out = []
        for g in range((step - 1) * batch_size, step * batch_size)[part]:
            epoch, pos = divmod(g, self.num_windows)
            out.append(int(self._order(epoch, seed)[pos]))
        return out

    def batch(self, step: int, batch_size: int, seed: int, part: slice = slice(None)) -> np.ndarray:
        """The windows of optimizer step ``step`` (1-based): a function of the step and the seed only.
        The time it takes is counted in ``wait_seconds`` (the step waits for it)."""
        t0 = time.perf_counter()
        wins = self._windows(step, batch_size, seed, part)
        out = np.empty((len(wins), self.seq_len + 1), np.int64)
        for j, w in enumerate(wins):
            self.window(w, out[j])
        self.wait_seconds += time.perf_counter() - t0
        return out

    def prefetch(self, step: int, batch_size: int, seed: int, part: slice = slice(None)) -> None:
        """Read the blocks of step ``step``'s windows into the node's cache in a background thread, while
        the current step computes (remote inputs with the cache on; nothing otherwise)."""
        remote = [s for s in self.sources if s.remote and s.stream.cache.enabled]
        if not remote or (self._prefetch is not None and self._prefetch.is_alive()):
            return

        def warm() -> None:
            try:
                for w in self._windows(step, batch_size, seed, part):
                    src, start = self._locate(w)
                    if src.remote:
                        for b in src.stream.blocks_of(start, start + self.seq_len + 1):
                            src.stream.warm(b)
            except Exception:  # noqa: BLE001 - the step's own read meets the error and reports it
                return

        self._prefetch = threading.Thread(target=warm, name="prepline-prefetch", daemon=True)
        self._prefetch.start()

    def stream_stats(self) -> dict:
        """The remote inputs' reads: GETs, seconds in them, and the node cache's hits and misses."""
        remote = [s.stream for s in self.sources if s.remote]
        caches = list({id(r.cache): r.cache for r in remote}.values())
        return {"remote_inputs": len(remote), "gets": sum(r.gets for r in remote),
                "get_seconds": round(sum(r.wait_seconds for r in remote), 3),
                "cache_hits": sum(c.hits for c in caches), "cache_misses": sum(c.misses for c in caches),
                "cache_corrupt": sum(c.corrupt for c in caches)}

    def tokenizer_files(self) -> dict[str, bytes]:
        """What goes next to the model: ``tokenizer.json`` (one vocabulary), or ``tokenizer-<k>.json``
        per vocabulary plus ``tokenizers.json`` (offsets, sizes, inputs) for separate vocabularies."""

        def read(uri: str) -> bytes | None:
            src = next(s for s in self.sources if s.uri == uri)
            try:
                return tokens_location(uri).read_bytes(src.index["tokenizer"])
            except FileNotFoundError:
                return None

        if len(self.vocabularies) == 1:
            data = read(self.sources[0].uri)
            return {"tokenizer.json": data} if data is not None else {}
        files, listing = {}, []
        for k, v in enumerate(self.vocabularies):
            data = read(v["inputs"][0])
            if data is not None:
                files[f"tokenizer-{k}.json"] = data
            listing.append({"file": f"tokenizer-{k}.json", **v})
        files["tokenizers.json"] = (json.dumps({"vocabularies": listing}, indent=2) + "\n").encode()
        return files


def _open(uri: str) -> tuple[dict, np.ndarray]:
    # InputError naming the path when it is not a tokenization output; s3:// in ranges through the node's cache
    index, ds = open_tokens(uri, stream=os.environ.get("PREPLINE_TOKEN_STREAM", "1") != "0")
    return index, ds.tokens
