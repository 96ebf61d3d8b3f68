"""How the rows of a ``data=`` input become one shard per rank: pure arithmetic, no I/O.

Rows are numbered in the input's order (on Spark: partition by partition, as ``RDD.zipWithIndex``
numbers them) and dealt out like cards: row ``i`` goes to shard ``i % np``, so every shard sees
the whole range of the input (a DataFrame sorted by label still gives every rank every label).
Shards are equal-sized by default: the last ``total % np`` rows are dropped, because ranks that
take different numbers of steps deadlock in their collectives. ``keep_remainder`` keeps them;
the first ``total % np`` shards then have one row more.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy

from hvd_magic.errors import DataError

__all__ = ["ShardPlan", "partition_offsets", "plan_shards"]


@dataclass(frozen=True)
class ShardPlan:
    """``total`` rows into ``np`` shards."""

    total: int
    np: int
    keep_remainder: bool = False

    @property
    def kept(self) -> int:
        """Rows that reach a shard."""
        return self.total if self.keep_remainder else self.total - self.total % self.np

    def sizes(self) -> list[int]:
        """Rows of each shard, in shard order."""
        base, extra = divmod(self.kept, self.np)
        return [base + (1 if shard < extra else 0) for shard in range(self.np)]

    def shard_of(self, first: int, count: int) -> numpy.ndarray:
        """The shard of rows ``first .. first+count-1`` (by global number); -1 for a dropped row."""
        index = numpy.arange(first, first + count, dtype=numpy.int64)
        return numpy.where(index < self.kept, index % self.np, -1)

    def notice(self, name: str) -> str:
        """What the user is told before the run, e.g. how many rows were dropped and why."""
        sizes = self.sizes()
        dropped = self.total - self.kept
        text = f"data={name}: {self.total:,} rows into {self.np} shards"
        if min(sizes) == max(sizes):
            text += f" of {sizes[0]:,} rows"
        else:
            extra = sizes.count(max(sizes))
            text += (
                f": ranks 0-{extra - 1} get {max(sizes):,} rows, the others {min(sizes):,} "
                "(remainder=keep; ranks that take fewer steps must not wait in a collective: "
                "use hvd.join() or count steps from the smallest shard)"
            )
        if dropped:
            text += (
                f"; dropped the last {dropped:,} so every rank has as many "
                "(remainder=keep keeps them, giving some ranks one row more)"
            )
        return text


def plan_shards(total: int, np: int, keep_remainder: bool = False, name: str = "data") -> ShardPlan:
    """The split of ``total`` rows over ``np`` ranks; a DataError when a rank would get none."""
    if total == 0:
        raise DataError(f"data={name} has no rows: there is nothing to give the {np} ranks.")
    if total < np:
        raise DataError(
            f"data={name} has {total:,} rows, fewer than the {np} ranks: every rank needs at least one. "
            f"Use np={total} or fewer, or more data."
        )
    return ShardPlan(total, np, keep_remainder)


def partition_offsets(counts: dict[int, int]) -> dict[int, int]:
    """The global number of the first row of each partition, given each partition's row count
    (a partition that is not in ``counts`` has no rows)."""
    offsets, running = {}, 0
    for partition in sorted(counts):
        offsets[partition] = running
        running += counts[partition]
    return offsets
