"""Answer extraction and math-verify grading shared by every task with mathematical answers
(MATH, Geometry3k): last ``\\boxed{}`` with counted fallbacks (:mod:`.extract`) and a pool of
worker processes with per-item timeouts (:mod:`.grading`)."""

from harness.mathgrade.extract import METHODS, check_methods, extract_answer, last_boxed
from harness.mathgrade.grading import GraderConfig, GradeResult, MathGrader

__all__ = ["METHODS", "GradeResult", "GraderConfig", "MathGrader", "check_methods",
           "extract_answer",
           "last_boxed"]
