"""Run one Data Prep Kit transform the way its own examples do (pure-Python runtime launcher).

    .venv-peers/dpk/bin/python benchmarks/peers/run_dpk.py STAGE INPUT OUTPUT ASSETS.json

Runs inside the DPK virtual environment (benchmarks/peers/requirements-dpk.txt), never imports
prepline. ASSETS.json names the files prepline ships that DPK's defaults would fetch from a hub:
``lid_model`` (fastText lid.176.ftz) and ``tokenizer_dir`` (a Hugging Face tokenizer folder).
Two worker processes (``runtime_num_processors``) where the transform accepts them; doc_id and
ededup refuse them in this runtime (one process), fdedup's orchestrator runs its four steps in
one process.
"""

from __future__ import annotations

import json
import os
import sys

WORKERS = 2
CRITERIA = ["length(contents) >= 20"]


def _launch(runtime_config, params: dict, src: str, dst: str) -> int:
    from data_processing.runtime.pure_python import PythonTransformLauncher
    from data_processing.utils import ParamsUtils

    params = {"data_local_config": ParamsUtils.convert_to_ast({"input_folder": src, "output_folder": dst}),
              "runtime_pipeline_id": "bench", "runtime_job_id": "bench", **params}
    sys.argv = ParamsUtils.dict_to_req(d=params)
    return PythonTransformLauncher(runtime_config=runtime_config).launch()


def doc_id(src: str, dst: str, assets: dict) -> int:
    from dpk_doc_id.runtime import DocIDPythonTransformRuntimeConfiguration

    return _launch(DocIDPythonTransformRuntimeConfiguration(),
                   {"doc_id_doc_column": "contents", "doc_id_hash_column": "doc_hash", "doc_id_int_column": "row_id"}, src, dst)


def exact_dedup(src: str, dst: str, assets: dict) -> int:
    from dpk_ededup.runtime import EdedupPythonTransformRuntimeConfiguration

    return _launch(EdedupPythonTransformRuntimeConfiguration(),
                   {"ededup_doc_column": "contents", "ededup_doc_id_column": "doc_id"}, src, dst)


def fuzzy_dedup(src: str, dst: str, assets: dict) -> int:
    # the orchestrator's own command line: signature, cluster, duplicate list, cleaning (defaults:
    # 112 permutations, 14 bands x 8, word 5-shingles, Jaccard 0.75); output in <dst>/cleaned
    from dpk_fdedup import transform_python as fd

    sys.argv = ["fdedup", "--input_folder", src, "--output_folder", dst, "--contents_column", "contents",
                "--document_id_column", "int_id_column",  # see harness._dpk_fdedup_input
                "--operation_mode", "filter_duplicates"]  # left out, the orchestrator annotates (output in annotated/)
    args = fd.parse_args()
    return fd.ServiceOrchestrator(global_params=args).orchestrate()


def lang_id(src: str, dst: str, assets: dict) -> int:
    from dpk_lang_id.transform_python import LangIdentificationPythonTransformConfiguration

    return _launch(LangIdentificationPythonTransformConfiguration(),
                   {"lang_id_model_url": assets["lid_model"], "lang_id_model_kind": "fasttext", "lang_id_model_credential": "",
                    "lang_id_content_column_name": "contents", "runtime_num_processors": WORKERS}, src, dst)


def doc_quality(src: str, dst: str, assets: dict) -> int:
    import dpk_doc_quality
    from dpk_doc_quality.transform_python import DocQualityPythonTransformConfiguration

    bad_words = os.path.join(os.path.dirname(dpk_doc_quality.__file__), "ldnoobw", "en")
    return _launch(DocQualityPythonTransformConfiguration(),
                   {"docq_text_lang": "en", "docq_doc_content_column": "contents", "docq_bad_word_filepath": bad_words,
                    "runtime_num_processors": WORKERS}, src, dst)


def filter(src: str, dst: str, assets: dict) -> int:  # noqa: A001 - the stage's name
    from dpk_filter.runtime import FilterPythonTransformConfiguration

    return _launch(FilterPythonTransformConfiguration(),
                   {"filter_criteria_list": CRITERIA, "filter_logical_operator": "AND",
                    "runtime_num_processors": WORKERS}, src, dst)


def tokenization(src: str, dst: str, assets: dict) -> int:
    from dpk_tokenization.runtime import TokenizationPythonConfiguration

    return _launch(TokenizationPythonConfiguration(),
                   {"tkn_tokenizer": assets["tokenizer_dir"], "tkn_doc_id_column": "id", "tkn_doc_content_column": "contents",
                    "runtime_num_processors": WORKERS}, src, dst)


STAGES = {f.__name__: f for f in (doc_id, exact_dedup, fuzzy_dedup, lang_id, doc_quality, filter, tokenization)}

if __name__ == "__main__":
    stage, src, dst, assets = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(open(sys.argv[4]).read())
    rc = STAGES[stage](src, dst, assets)
    sys.exit(0 if rc in (0, None) else 1)
