"""The fine-tuning step: a causal LM trained on the tokenization stage's token shards.

* :mod:`prepline.train.model` - a small GPT-style causal LM in plain torch, from a config;
* :mod:`prepline.train.train` - the training function (:func:`train`), its command line
  (``python -m prepline.train``) and the local mode (:func:`run_local`, a subprocess);
* :mod:`prepline.train.trainjob` - the cluster mode: a Kubeflow Trainer ``TrainJob`` built,
  created through the Kubernetes API, watched, its logs streamed, and deleted.

Nothing here imports torch or the Kubernetes client at import time (the ``train`` extra and the
``kubernetes`` package are needed only by the parts that use them).
"""

from prepline.train.train import TrainConfig, build_args, read_summary, run_local, train

__all__ = ["TrainConfig", "build_args", "read_summary", "run_local", "train"]
