"""The fine-tuning step: a causal LM trained on the tokenization stage's Megatron token data.

* :mod:`prepline.train.model` - a small GPT-style causal LM in plain torch, from a config;
* :mod:`prepline.train.train` - the training function (:func:`train`, a sequence of named steps),
  its command line (``python -m prepline.train``) and the local mode (:func:`run_local`, a subprocess);
* :mod:`prepline.train.config` - its parameters (:class:`TrainConfig`);
* :mod:`prepline.train.data` - the training windows over the Megatron token data of tokenization outputs;
* :mod:`prepline.train.models` - the model to train: new, or a base checkpoint (ours, a state_dict, Hugging Face);
* :mod:`prepline.train.checkpoints` - checkpoints and resume (a restarted run ends bit-identical);
* :mod:`prepline.train.trainjob` - the cluster mode: a Kubeflow Trainer ``TrainJob`` built,
  created through the Kubernetes API, watched, its logs streamed, and deleted.

Nothing here imports torch or the Kubernetes client at import time (the ``train`` extra and the
``kubernetes`` package are needed only by the parts that use them).
"""

from prepline.train.train import TrainConfig, build_args, read_summary, run_local, train

__all__ = ["TrainConfig", "build_args", "read_summary", "run_local", "train"]
