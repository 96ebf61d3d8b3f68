"""Columns in and out: checks before a fit, the flat feature array a model reads, and the same
conversion on the ranks (Arrow to numpy), so training and inference see the same input."""

from __future__ import annotations

from typing import Any

from hvd_magic.errors import DataError

__all__ = [
    "check_columns",
    "feature_array",
    "features_column",
    "input_shapes_of",
    "label_array",
    "model_inputs",
    "prediction_column",
]

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


def check_columns(
    df: Any, features: list[str], labels: list[str] | None, validation: str | None = None
) -> None:
    """A DataError naming what is missing or unusable, before anything launches (``labels``:
    None where none is read, as in a model's ``transform``)."""
    if not features:
        raise DataError(
            "feature_cols is empty: name the column(s) the model reads, e.g. feature_cols=['features']"
        )
    if labels is not None and not labels:
        raise DataError("label_cols is empty: name the column(s) the model learns, e.g. label_cols=['label']")
    labels = labels or []
    types = {field.name: field.dataType for field in df.schema.fields}
    extra = [validation] if validation else []
    missing = [name for name in [*features, *labels, *extra] if name not in types]
    if missing:
        raise DataError(
            f"the DataFrame has no column {', '.join(map(repr, missing))}; its columns: {', '.join(types)}"
        )
    for role, names, usable in (
        ("feature", features, ("number", "array", "vector")),
        ("label", labels, ("number", "array", "vector")),
        ("validation", extra, ("number",)),
    ):
        for name in names:
            if _kind(types[name]) not in usable:
                raise DataError(
                    f"{role} column {name!r} is {types[name].simpleString()}; a {role} column must be "
                    + (
                        "a number, an array of numbers or an ML vector (cast or index it first, e.g. "
                        "with StringIndexer)"
                        if role != "validation"
                        else "boolean (or 0/1): true marks a validation row"
                    )
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
            _check_even(name, column)
            parts.append(column.flatten().to_numpy(zero_copy_only=False).reshape(rows, -1))
        else:
            parts.append(column.to_numpy(zero_copy_only=False).reshape(rows, 1))
    return numpy.concatenate(parts, axis=1).astype(numpy.float32, copy=False)


def _check_even(name: str, column: Any) -> None:
    """An array column's rows all of one length and none null (flattened, they would shift
    one row's values into the next), else a DataError that names it."""
    import pyarrow.compute as pc

    lengths = pc.list_value_length(column)
    if lengths.null_count:
        raise DataError(
            f"column {name!r} has {lengths.null_count} null row(s): an array column's every row needs "
            "its values (fill or drop them first, e.g. df.dropna(subset=[...]))"
        )
    span = pc.min_max(lengths)
    low, high = span["min"].as_py(), span["max"].as_py()
    if low != high:
        raise DataError(
            f"column {name!r} holds arrays of {low} to {high} values: every row's must be as long "
            "(pad or cut them to one length first)"
        )


def label_array(table: Any, labels: list[str]) -> Any:
    """On a rank: labels as int64 (integer columns: classes) or float32; one scalar label as a
    vector of rows, else a matrix (vector labels, e.g. one-hot, flattened and side by side)."""
    import numpy

    columns = [table.column(name).combine_chunks() for name in labels]
    if len(columns) > 1 or _is_list(columns[0]):
        values = feature_array(table, labels)
        return values.astype(numpy.int64) if _integers(columns) else values
    values = columns[0].to_numpy(zero_copy_only=False)
    if numpy.issubdtype(values.dtype, numpy.integer) or values.dtype == bool:
        return values.astype(numpy.int64)
    return values.astype(numpy.float32)


def _is_list(column: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_list(column.type) or pa.types.is_large_list(column.type))


def _integers(columns: list[Any]) -> bool:
    import pyarrow as pa

    return all(pa.types.is_integer(column.type) or pa.types.is_boolean(column.type) for column in columns)


def input_shapes_of(shapes: Any) -> list[list[int]] | None:
    """``input_shapes`` as lists of ints (batch first), or a ValueError saying what to give."""
    if shapes is None:
        return None
    try:
        found = [[int(dim) for dim in shape] for shape in shapes]
    except (TypeError, ValueError):
        found = []
    if not found or any(len(shape) < 2 for shape in found):
        raise ValueError(
            f"input_shapes={shapes!r}: give one shape a model input, batch first, e.g. [[-1, 1, 28, 28]]"
        )
    return found


def model_inputs(x: Any, shapes: list[list[int]] | None) -> list[Any]:
    """A batch of flat feature rows as the model's inputs: as it is without shapes; reshaped to
    the one shape; or cut into one part a shape (each as wide as its shape holds) and reshaped."""
    if not shapes:
        return [x]
    if len(shapes) == 1:
        return [x.reshape(len(x), *shapes[0][1:])]
    import numpy

    widths = [int(numpy.prod(shape[1:])) for shape in shapes]
    if min(widths) <= 0 or sum(widths) != x.shape[1]:
        raise DataError(
            f"input_shapes {shapes} hold {'+'.join(map(str, widths))} features a row, the feature "
            f"columns {x.shape[1]}: give each input's whole shape (one -1, for the batch, first)"
        )
    cuts = numpy.cumsum(widths)[:-1]
    return [
        part.reshape(len(x), *shape[1:])
        for part, shape in zip(numpy.split(x, cuts, axis=1), shapes, strict=True)
    ]
