"""Which databases a prediction must match the gold on: the one it was asked about, and a suite beside it.

- `Suite(variants=K)`: the original plus K variants built by `rewards.variants` (cached on disk). The
  execution reward with `reward.variants: K`: a query that is right only by luck on the shipped database
  is wrong on a variant.
- `Suite(folder=True)`: a test suite in the official layout of Zhong et al. (2020): every `*.sqlite` file in
  the database's folder (`<root>/<db_id>/*.sqlite`). Test-suite accuracy (TS), with the official matching:
  the tie rule of `rewards.ties` applies to our variants only.

A suite is a small frozen record, so it travels to executor worker processes and across config files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rewards.variants import VariantCache


@dataclass(frozen=True)
class Suite:
    variants: int = 0  # K variants of each database, built by rewards.variants
    cache_dir: str | None = None  # where variants live (None: rewards.variants.default_cache_dir())
    seed: int = 0  # variant j of a database is built from (seed, j): the same files every time
    folder: bool = False  # also every other *.sqlite beside the database (an official test-suite folder)

    def __post_init__(self):
        if self.variants < 0:
            raise ValueError(f"variants must be >= 0, got {self.variants}")

    def __bool__(self) -> bool:
        return self.variants > 0 or self.folder

    def extra_paths(self, db_path: Path) -> list[Path]:
        """The databases besides `db_path` that a prediction must also match on (variants built now if needed).

        Example:
            >>> Suite().extra_paths(Path("any.sqlite")), bool(Suite()), bool(Suite(variants=3))
            ([], False, True)
        """
        return self.folder_paths(db_path) + self.variant_paths(db_path)

    def folder_paths(self, db_path: Path) -> list[Path]:
        """Every other name containing '.sqlite' in the database's folder, as the official evaluator lists them."""
        if not self.folder:
            return []
        db_path = Path(db_path)
        return sorted(p for p in db_path.parent.iterdir() if ".sqlite" in p.name and p.is_file()
                      and p.name != db_path.name)

    def variant_paths(self, db_path: Path) -> list[Path]:
        return VariantCache(self.cache_dir, self.seed).paths(db_path, self.variants) if self.variants else []
