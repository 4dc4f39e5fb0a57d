"""The store's day partitions, where the tables are laid out by day: made ahead, dropped
when their day has passed the retention.

The layout itself (``pikku_celery.schema.partitions``) is chosen once, by ``pikku-celery
db upgrade --layout partitioned``; this operation keeps it, from the workers' upkeep (under
the reaper's lease) and from ``prune``. Whether the tables are partitioned is read once per
operation: a database is converted before the workers that write to it start, or they are
restarted after it, as for ``db distribute``.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Collection
from dataclasses import dataclass, field

from pikku_celery.schema import partitions
from pikku_celery.schema.partitions import Conversion, DroppedDay, MadeDays
from pikku_celery.store.connector import Connector

__all__ = ["DayPartitions", "KeptDays"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KeptDays:
    """What one ``keep`` did: partitions made, days dropped (with the rows each table lost),
    and the rows the default partitions hold (rows of a day that had no partition)."""

    made: tuple[str, ...] = ()
    dropped: tuple[DroppedDay, ...] = ()
    in_defaults: dict[str, int] = field(default_factory=dict)

    @property
    def dropped_days(self) -> list[dt.date]:
        return [day.day for day in self.dropped]

    def as_dict(self) -> dict[str, object]:
        return {
            "made": len(self.made),
            "dropped_days": [str(day) for day in self.dropped_days],
            "dropped_runs": sum(day.rows.get("workflow_runs", 0) for day in self.dropped),
            "in_defaults": dict(self.in_defaults),
        }


class DayPartitions:
    """Makes and drops the day partitions of a database in the partitioned layout."""

    def __init__(self, db: Connector) -> None:
        self._db = db
        self._partitioned: bool | None = None

    def partitioned(self) -> bool:
        """The tables are laid out by day; read once, then remembered (False on SQLite)."""
        if self._partitioned is None:
            self._partitioned = self.layout() == "partitioned"
        return self._partitioned

    def layout(self) -> str:
        """``"partitioned"`` or ``"plain"``, read now."""
        if not self._db.sql.distributable:  # SQLite: one layout
            return "plain"
        # Through the driver's own cursor, as the distributed layout is read: a look at the
        # catalogue, not a statement of the store's (those are all in ``store/sql``).
        with (
            self._db.read(None) as conn,
            conn.connection.dbapi_connection.cursor() as cursor,  # type: ignore[union-attr]
        ):
            cursor.execute(partitions.IS_PARTITIONED)
            return "partitioned" if cursor.fetchone()[0] else "plain"

    def convert(self, *, today: dt.date | None = None) -> Conversion:
        """Lay the run tables out by day (``schema.partitions.convert``); a database already
        so is left as it is."""
        partitions.check_dialect(self._db.engine.dialect.name)  # before connecting
        with self._db.errors():
            done = partitions.convert(self._db.engine, today=today)
        self._partitioned = True
        return done

    def make_days(self, first: dt.date, last: dt.date) -> MadeDays:
        """Make the partitions of every day from ``first`` to ``last`` that has none."""
        with self._db.errors():
            return partitions.make_days(self._db.engine, first, last)

    def drop_days(
        self, before: dt.date, *, statuses: Collection[str] | None = None
    ) -> list[DroppedDay]:
        """Drop the partitions of the days before ``before`` that hold no open run (nor,
        given ``statuses``, a run of another status); a transaction a day."""
        with self._db.errors():
            return partitions.retire_days(self._db.engine, before, statuses=statuses)

    def keep(self, retention: dt.timedelta | None, now: dt.datetime | None = None) -> KeptDays:
        """Make the partitions of today and the next days; with a ``retention``, drop the
        days wholly older than ``now - retention`` (open runs' days are kept).

        ``now``: an aware datetime (the database's clock when not given).
        """
        if now is not None and now.tzinfo is None:
            raise ValueError("`now` must be an aware datetime (UTC), not a naive one.")
        if retention is not None and retention < dt.timedelta(days=1):
            raise ValueError("A retention of day partitions is one day or more.")
        with self._db.errors():
            if now is None:
                with self._db.read(None) as conn:
                    now = conn.exec_driver_sql("SELECT statement_timestamp()").scalar_one()
            assert now is not None
            today = now.astimezone(dt.timezone.utc).date()
            made = partitions.make_days(
                self._db.engine, today, today + dt.timedelta(days=partitions.AHEAD_DAYS)
            )
            dropped: list[DroppedDay] = []
            if retention is not None:
                cutoff = (now - retention).astimezone(dt.timezone.utc).date()
                dropped = partitions.retire_days(self._db.engine, cutoff)
            with self._db.read(None) as conn:
                in_defaults = partitions.default_rows(conn)
        if in_defaults:
            logger.warning(
                "pikku-celery found rows in the default partitions (a day that had no "
                "partition of its own): %s; they are kept, and moved to their day's partition "
                "if it is made",
                in_defaults,
                extra={"action": "partition_default_rows", "rows": in_defaults},
            )
        return KeptDays(made.made, tuple(dropped), in_defaults)
