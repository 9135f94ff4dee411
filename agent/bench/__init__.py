"""Benchmarks of planners against toyworld's ground truth."""

PLANNERS = ("protocol", "wiles", "random")
PLANNER_HELP = {
    "protocol": "captioning + single-attribute perturbations, refinement, counterfactuals, confirmation",
    "wiles": "captioning of failures and confirmation only (Wiles et al.'s core loop, no refinement or edits)",
    "random": "random caption perturbations on a fixed sample size, same budget, confirmation",
}

__all__ = ["PLANNERS", "PLANNER_HELP"]
