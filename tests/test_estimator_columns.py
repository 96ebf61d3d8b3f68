"""The estimators' rows on a rank (pure, over Arrow tables): validation rows drawn, not the
shard's last; array columns refused where their rows are uneven or null; a fit without labels
and a transform without its feature column refused with the column named."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from hvd_magic import DataError
from hvd_magic.spark.columns import check_columns, feature_array
from hvd_magic.spark.training import TrainSpec, load_rows


def spec(validation: float, seed: int = 7) -> TrainSpec:
    return TrainSpec(
        model=None, optimizer=None, loss=None, metrics=[], feature_cols=["x"], label_cols=["y"],
        batch_size=8, epochs=1, validation=validation, seed=seed, shuffle=True, verbose=0,
    )  # fmt: skip


def test_validation_rows_are_drawn_from_the_whole_shard_not_its_end(monkeypatch):
    """A shard sorted by its label (80 rows of 0, then 20 of 1): the last fifth held out meant
    training on label 0 only and validating on label 1 only, without a word."""
    import hvd_magic.data

    table = pa.table({"x": np.arange(100, dtype=np.float64), "y": np.repeat([0, 1], [80, 20])})
    monkeypatch.setattr(hvd_magic.data, "shard", lambda kind: table)
    rows = load_rows(spec(0.2))
    assert (len(rows.x), len(rows.val_x)) == (80, 20)
    assert set(rows.y) == {0, 1} and set(rows.val_y) == {0, 1}
    assert sorted(np.concatenate([rows.x, rows.val_x])[:, 0]) == list(range(100))  # each row once
    again = load_rows(spec(0.2))
    assert np.array_equal(again.val_x, rows.val_x)  # the run's seed: a retry holds out the same rows
    assert not np.array_equal(load_rows(spec(0.2, seed=8)).val_x, rows.val_x)


@pytest.mark.parametrize(
    ("values", "said"),
    [
        ([[1.0, 2.0, 3.0], [4.0]], "holds arrays of 1 to 3 values"),
        ([[1.0, 2.0], None, [5.0, 6.0]], "has 1 null row"),
    ],
)
def test_an_array_column_of_uneven_or_null_rows_is_refused_naming_it(values, said):
    """[[1,2,3],[4]] was read as [[1,2],[3,4]]: row 0 took part of row 1's features."""
    with pytest.raises(DataError, match=f"column 'pixels' {said}"):
        feature_array(pa.table({"pixels": pa.array(values, pa.list_(pa.float64()))}), ["pixels"])


class Frame:
    """What check_columns reads of a Spark DataFrame: its schema's fields' names and types."""

    def __init__(self, **types: object) -> None:
        from types import SimpleNamespace

        self.schema = SimpleNamespace(fields=[SimpleNamespace(name=n, dataType=t) for n, t in types.items()])


def test_a_fit_without_labels_and_a_transform_without_its_features_are_named_before_launch():
    from pyspark.sql.types import DoubleType, StringType

    frame = Frame(features=DoubleType(), label=DoubleType(), name=StringType())
    with pytest.raises(DataError, match=r"label_cols is empty: name the column\(s\) the model learns"):
        check_columns(frame, ["features"], [])
    check_columns(frame, ["features"], None)  # a transform reads no label
    with pytest.raises(DataError, match="has no column 'pixels'; its columns: features, label, name"):
        check_columns(frame, ["pixels"], None)
    with pytest.raises(DataError, match="feature column 'name' is string"):
        check_columns(frame, ["name"], None)


def test_a_model_dir_given_as_a_one_slash_url_is_that_folder(tmp_path, monkeypatch):
    """model.save('file:/x'), model_dir='file:/x': written to ./file:/x before."""
    from hvd_magic.spark.persistence import local_folder

    monkeypatch.chdir(tmp_path)
    with local_folder(f"file:{tmp_path}/model") as folder:
        assert folder == f"{tmp_path}/model"
