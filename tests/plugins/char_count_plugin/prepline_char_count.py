"""char_count: a plug-in transform (a separate distribution, found through its entry point)."""

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from prepline.config import TransformConfig, param
from prepline.transform import Column, FileTask, Output, Transform


@dataclass(frozen=True)
class CharCountConfig(TransformConfig):
    content_column: str = param("contents", "column holding the document text")
    count_column: str = param("n_chars", "column to add with the number of characters")
    min_chars: int = param(0, "documents with fewer characters are removed (reason too_short)", min=0)


class CharCount(Transform):
    name = "char_count"
    Config = CharCountConfig
    summary = "count the characters of every document (a plug-in)"
    headline = ("removed.*",)  # its numbers in the KFP step's Markdown and Metrics and the run report

    def input_columns(self) -> list[Column]:
        return [Column(self.config.content_column, "string")]

    def added_columns(self) -> list[str]:
        return [self.config.count_column]

    def transform(self, table: pa.Table, task: FileTask) -> Output:
        n = pc.utf8_length(table[self.config.content_column]).cast(pa.int64())
        out = table.append_column(self.config.count_column, n).filter(pc.greater_equal(n, self.config.min_chars))
        return Output.of(out, removed={"too_short": table.num_rows - out.num_rows})
