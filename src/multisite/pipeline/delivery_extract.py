"""Re-extracting a delivery remote with Spark: ``multisite delivery extract --spark``.

The rows come from ``seeding.state_df``: the publication's regions read by Spark from one consistent
copy of the store (partitioned by key ranges, so a large publication is read in parallel), then
filtered by the subscription and committed into the new remote instance by
``delivery.server.api.extract``, which also restarts the link at the journal's end offset on both sides. The
consolidated instance is held open (locked) meanwhile, so its state and that offset agree.
"""

from __future__ import annotations

import os


def extract(db, subscriber: str, to: str | os.PathLike, *, spark=None) -> dict:
    """``delivery.server.api.extract`` with the rows read by Spark (see the module's docstring)."""
    from pyspark.sql import functions as F

    from ..delivery.server import api
    from ..delivery import sysremote
    from ..errors import DeliveryConfigError
    from ..keys import decode_key
    from .env import session
    from .seeding import state_df

    setup = sysremote.load(db)
    link = setup.links.get(subscriber)
    if link is None or link.publication not in setup.publications:
        raise DeliveryConfigError(f"{subscriber!r} is not a subscriber of {db.name}")
    regions = setup.publications[link.publication].regions
    db.flush()  # the store holds every commit: the state Spark reads is the state now
    spark = spark or session()
    df, _ = state_df(spark, str(db.layout.root), with_fields=False, payload=["key_bytes", "value_raw"])
    df = df.where(F.col("region").isin(list(regions))).select("region", "key_bytes", "value_raw")
    rows = ((r["region"], decode_key(bytes(r["key_bytes"])), bytes(r["value_raw"])) for r in df.toLocalIterator())
    return api.extract(db, subscriber, to, rows=rows)
