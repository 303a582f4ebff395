"""Settings that configs written by earlier versions record and this version no longer has.

A flag that could hold one value only (``--parallelism.tp`` and ``--parallelism.cp``,
always 1; ``--optimizer.type``, always ``adamw``) was removed rather than kept as a flag
that only refuses. A ``train_config.json`` an earlier run wrote still records it, and
must keep resuming: a retired key holding the one value it could have is dropped when a
config file is read. Any other value is left in place, so validation refuses it as the
unknown field it now is.
"""

from __future__ import annotations

from typing import Any

# (section, field) -> the one value the field could hold.
RETIRED: dict[tuple[str, str], Any] = {
    ("parallelism", "tp"): 1,
    ("parallelism", "cp"): 1,
    ("optimizer", "type"): "adamw",
}


def without_retired(raw: dict[str, Any]) -> dict[str, Any]:
    """``raw`` (a config file's object) without the retired keys that hold their one value."""
    out = dict(raw)
    for (section, field), value in RETIRED.items():
        node = out.get(section)
        if isinstance(node, dict) and field in node and node[field] == value and type(node[field]) is type(value):
            out[section] = {key: item for key, item in node.items() if key != field}
    return out
