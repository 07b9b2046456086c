"""Token data: tokenizers, the Megatron indexed-dataset format and the run-wide shared tokenizer.

* :mod:`prepline.tokens.tokenizer` - loading a tokenizer (``tokenizer.json``, a Hugging Face
  tokenizer folder, GPT-2 BPE files), training a byte-level BPE, sampling training text;
* :mod:`prepline.tokens.indexed` - the Megatron-LM / NeMo indexed dataset (``.bin`` + ``.idx``),
  written and read with our own code (megatron-core reads it back in the tests);
* :mod:`prepline.tokens.output` - the ``tokens/`` folder of a tokenization output: ``index.json``,
  ``tokenizer.json`` and the dataset, and reading it back;
* :mod:`prepline.tokens.shared` - one tokenizer trained on a sample of several branches
  (``prepline tokens train-tokenizer``), so every branch of a run encodes with the same vocabulary.

Nothing here imports ``tokenizers`` or torch at import time.
"""
