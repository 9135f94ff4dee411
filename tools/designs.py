"""The sizes of a confirmation attempt (kept free of scipy: the run configuration declares them at start-up)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from sleuth.tools.stats import SequentialPlan

Spending = Literal["obrien-fleming", "pocock"]
"""How a sequential test spreads its alpha over its looks (tools/stats/sequential.py)."""


class ConfirmationDesign(BaseModel):
    """The sizes of a confirmation attempt, fixed before the confirmation baseline is drawn (tools/stats/__init__.py:
    a design chosen after the baseline's count is seen would make Fisher's p invalid given that count)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    first_n: int = Field(ge=10, le=2000, description="Images at the first look.")
    max_n: int = Field(ge=20, le=5000, description="Most images of an attempt.")
    attempts: int = Field(ge=1, le=100, description="Attempts of the declared family made with these sizes.")
    spending: Spending = Field(
        "obrien-fleming", description="How an attempt's alpha is spread over its looks: 'obrien-fleming' keeps nearly "
                                      "all of it for the last look; 'pocock' spends it more evenly, so that clear "
                                      "effects stop at an early look.")

    baseline_n: int | None = Field(
        None, ge=50, le=20_000,
        description="Confirmation baseline images an attempt of these sizes compares with: the first baseline_n of the "
                    "confirmation baseline's images, drawn up to this size when first needed. Declared designs either "
                    "all give it or none does. None: the size the first attempt draws, for every attempt.")

    @property
    def key(self) -> tuple[int, int]:
        return min(self.first_n, self.max_n), self.max_n

    def plan(self, alpha: float) -> SequentialPlan:
        from sleuth.tools.stats import default_plan  # scipy: only when a test is planned, not at start-up

        return default_plan(self.max_n, first=self.key[0], alpha=alpha, spending=self.spending)

    def text(self) -> str:
        shape = "" if self.spending == "obrien-fleming" else f", {self.spending.capitalize()} spending"
        base = "" if self.baseline_n is None else f", against the first {self.baseline_n} baseline images"
        return f"first look {self.key[0]}, at most {self.max_n} images{shape}{base}"
