"""``prepline tokens``: train the run-wide tokenizer, print Megatron's ``--data-path`` for token outputs."""

from __future__ import annotations

import argparse

from prepline.errors import ConfigError


def _train(argv: list[str]) -> int:
    from prepline.cli import _add_param_options, params_from_args
    from prepline.tokens.shared import SharedTokenizerConfig, train_shared_tokenizer

    ap = argparse.ArgumentParser(prog="prepline tokens train-tokenizer",
                                 description="Train one byte-level BPE on a sample of every input (one folder per branch).")
    ap.add_argument("--input", action="append", required=True, help="a folder or s3:// URI of Parquet files; repeat per branch")
    ap.add_argument("--output", required=True, help="folder for tokenizer.json and tokenizer_train.json")
    ap.add_argument("--params", default=None, help="parameters as a JSON object (flags win)")
    _add_param_options(ap, SharedTokenizerConfig.params())
    a = ap.parse_args(argv)
    record = train_shared_tokenizer(a.input, a.output, params_from_args(a, SharedTokenizerConfig))
    for r in record["inputs"]:
        print(f"{r['input']}: {r['docs']:,} docs, {r['chars']:,} chars from {r['files_read']} of {r['files']} files")
    print(f"tokenizer: {record['vocab_size']:,} ids, trained on {record['train_chars']:,} chars "
          f"(sha256 {record['tokenizer_sha256'][:12]}) -> {a.output.rstrip('/')}/{record['tokenizer']}")
    return 0


def _data_path(argv: list[str]) -> int:
    from prepline.tokens.output import megatron_data_path

    ap = argparse.ArgumentParser(prog="prepline tokens data-path",
                                 description="Print Megatron-LM's --data-path (token count, prefix, ...) for tokenization outputs.")
    ap.add_argument("outputs", nargs="+", help="tokenization outputs (or their tokens/ folders)")
    a = ap.parse_args(argv)
    print(megatron_data_path(a.outputs))
    return 0


ACTIONS = {"train-tokenizer": _train, "data-path": _data_path}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ACTIONS:
        if argv and argv[0] in ("-h", "--help"):
            print("usage: prepline tokens {train-tokenizer,data-path} ...  (--help on each)")
            return 0
        raise ConfigError(f"prepline tokens needs an action ({', '.join(ACTIONS)})", "e.g. prepline tokens train-tokenizer --help")
    return ACTIONS[argv[0]](argv[1:])

