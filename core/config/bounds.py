"""The numeric ranges every config value must lie in, checked when the config is validated.

A number the run cannot use otherwise fails long after parsing, inside torch, numpy or
the standard library, as a traceback: a seed past 2**64 (``torch.manual_seed``), a
negative seed (``numpy.random.default_rng``), a timeout past what ``timedelta`` and
thread waits accept, an integer too large for a float (a transform range), a NaN
weight. So every integer of every config section, plugin sections included, must fit
in int64, every float must be finite (``allow_inf_nan=False`` on the section bases), and
the fields with narrower limits say so with ``Annotated`` types from here.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

INT64_MAX = 2**63 - 1
SEED_LIMIT = 2**32  # numpy's legacy seeds (the DataLoader workers' np.random.seed) lie below it
SECONDS_MAX = 2**31 - 1  # 68 years; every timeout API accepts it

# A seed of weights, data order, dropout or generated data: numpy refuses negative seeds.
Seed = Annotated[int, Field(ge=0, lt=SEED_LIMIT)]
# A timeout in whole seconds.
Seconds = Annotated[int, Field(ge=1, le=SECONDS_MAX)]


def within_int64(value: Any) -> Any:
    """``value`` unchanged when every integer in it (inside lists and mappings too) fits in int64.

    A pydantic validator for all fields of a section: ``ValueError`` is its one-line error.
    """
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, int) and not isinstance(item, bool) and not -INT64_MAX - 1 <= item <= INT64_MAX:
            shown = str(item) if abs(item) < 10**30 else f"an integer of {item.bit_length()} bits"
            raise ValueError(f"{shown} is beyond the range of a 64-bit integer (±9.2e18), which torch computes in")
        if isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
    return value
