"""``UnitGroup``: several modules that are one FSDP unit, and the method that runs them.

Torch-free, so a plugin's policy module can name its groups through ``lerobot_kit.api``
without importing torch's distributed packages first; ``wrap_units`` explains what a
group is for and how a run resolves, shards and checkpoints it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class UnitGroup:
    """Modules sharded as one FSDP unit, and the method of the first that runs them (see
    ``core.parallel.wrap_units``). Paths are relative to the policy that declares the group."""

    paths: tuple[str, ...]
    method: str | None = None

    @property
    def name(self) -> str:
        """How plans and errors name the unit: its module paths joined by ``+``."""
        return "+".join(self.paths)

    def under(self, prefix: str) -> UnitGroup:
        """The group with its paths seen from a module ``prefix`` above the policy (a PEFT wrapper)."""
        return UnitGroup(tuple(f"{prefix}.{p}" if prefix else p for p in self.paths), self.method)
