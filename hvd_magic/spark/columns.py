"""Columns in and out: checks before a fit, the flat feature array a model reads, and the same
conversion on the ranks (Arrow to numpy), so training and inference see the same input."""

from __future__ import annotations

from typing import Any

from ..errors import DataError

__all__ = ["check_columns", "feature_array", "features_column", "label_array", "prediction_column"]

_NUMBERS = ("ByteType", "ShortType", "IntegerType", "LongType", "FloatType", "DoubleType", "BooleanType")


def _kind(data_type: Any) -> str:
    """'number', 'array' (of numbers), 'vector' (Spark ML) or the type's name."""
    name = type(data_type).__name__
    if name in _NUMBERS:
        return "number"
    if name == "VectorUDT":
        return "vector"
    if name == "ArrayType" and type(data_type.elementType).__name__ in _NUMBERS:
        return "array"
    return data_type.simpleString()  # type: ignore[no-any-return]


def check_columns(df: Any, features: list[str], labels: list[str]) -> None:
    """A DataError naming what is missing or unusable, before anything launches."""
    if not features:
        raise DataError(
            "feature_cols is empty: name the column(s) the model reads, e.g. feature_cols=['features']"
        )
    types = {field.name: field.dataType for field in df.schema.fields}
    missing = [name for name in [*features, *labels] if name not in types]
    if missing:
        raise DataError(
            f"the DataFrame has no column {', '.join(map(repr, missing))}; its columns: {', '.join(types)}"
        )
    for role, names, usable in (
        ("feature", features, ("number", "array", "vector")),
        ("label", labels, ("number",)),
    ):
        for name in names:
            if _kind(types[name]) not in usable:
                raise DataError(
                    f"{role} column {name!r} is {types[name].simpleString()}; a {role} must be "
                    + ("a number, an array of numbers or an ML vector" if role == "feature" else "a number")
                    + " (cast or index it first, e.g. with StringIndexer)"
                )


def features_column(df: Any, features: list[str]) -> Any:
    """One array<float> column: the feature columns flattened and concatenated, in order."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F

    types = {field.name: field.dataType for field in df.schema.fields}
    parts = []
    for name in features:
        kind = _kind(types[name])
        column = F.col(name)
        parts.append(
            vector_to_array(column) if kind == "vector" else column if kind == "array" else F.array(column)
        )
    return F.concat(*parts).cast("array<float>")


def prediction_column(output: Any) -> Any:
    """The argmax of a vector output (a class, as a double), or a one-value output itself."""
    from pyspark.sql import functions as F

    argmax = F.array_position(output, F.array_max(output)) - 1
    return F.when(F.size(output) == 1, output[0]).otherwise(argmax).cast("double")


def feature_array(table: Any, features: list[str]) -> Any:
    """On a rank: the feature columns of an Arrow table as one float32 matrix (rows x width)."""
    import numpy
    import pyarrow as pa

    rows, parts = table.num_rows, []
    for name in features:
        column = table.column(name).combine_chunks()
        if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
            parts.append(column.flatten().to_numpy(zero_copy_only=False).reshape(rows, -1))
        else:
            parts.append(column.to_numpy(zero_copy_only=False).reshape(rows, 1))
    return numpy.concatenate(parts, axis=1).astype(numpy.float32, copy=False)


def label_array(table: Any, labels: list[str]) -> Any:
    """On a rank: labels as int64 (integer columns: classes) or float32, one column per label."""
    import numpy

    columns = [table.column(name).to_numpy(zero_copy_only=False) for name in labels]
    values = columns[0] if len(columns) == 1 else numpy.stack(columns, axis=1)
    if numpy.issubdtype(values.dtype, numpy.integer) or values.dtype == bool:
        return values.astype(numpy.int64)
    return values.astype(numpy.float32)
