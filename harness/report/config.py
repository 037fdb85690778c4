"""Board configs (``conf/board/*.yaml``, read by ``rlbench board --config``; not a Hydra group):
pairings, the keys that label rows, the statistics, and an optional hyperparameter selection."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from harness.config import CONF_DIR
from harness.manifest import source_checkout
from harness.report.tables import metric_spec
from harness.typed_config import ConfigError

__all__ = ["CONTROL_ROLES", "BoardConfig", "BoardError", "CurveSpec", "Plan", "Selection",
           "load_config"]

# What the paths a board page prints (its --out, --runs) are relative to: the checkout rlbench
# runs from (harness.manifest.source_checkout), else the working directory, so an installed
# rlbench prints commands that work where they were run.
REPO = source_checkout() or Path.cwd().resolve()
DEFAULT_CONFIG = CONF_DIR / "board" / "default.yaml"


class BoardError(ConfigError):
    """A board that cannot be built as asked; the message names what to change (exit 2)."""


@dataclass(frozen=True)
class Selection:
    """Pick one value of ``key`` per row (e.g. the learning rate): the value whose runs have the
    best mean ``final/<metric>`` over seeds (``higher`` is better unless false); ties go to the
    first value in sorted order. The metric's eval set (a validation split) is then left out of
    the board's tables, which report the other eval sets at the chosen value."""

    key: str
    metric: str
    higher: bool = True
    # tuning seeds: the choice reads these seeds' runs alone and the board reports the others
    # (empty: the reported seeds choose too, and the board says so)
    seeds: tuple[str, ...] = ()

    @property
    def eval_set(self) -> str:
        return self.metric.split("/", 1)[0]


@dataclass(frozen=True)
class CurveSpec:
    """A response curve (harness/report/curves.py): the final metric ``y`` of the rows of
    algorithm ``rows`` against their runs' config key ``x``, ``baseline`` drawn as a band and
    ``identity`` the line y = x."""

    name: str
    rows: str
    x: str
    y: str
    baseline: str | None = None
    identity: bool = False


CONTROL_ROLES = ("positive", "aa")  # a handicapped baseline; the baseline on other seeds
CONTROL_OPTIONS = ("metric", "direction")  # what they are tested on; where the positive must go


@dataclass(frozen=True)
class Plan:
    """The analysis a board declares before it is read (harness/report/analysis.py): the
    primary metric (``<eval set>/pass_at_<k>`` of the last evaluation; None: the first eval
    set's pass@1), the family's level ``alpha``, the ``power`` its MDE is computed for, per
    named sweep the effect it is ``detect``-powered for (a board whose MDE is above it, or whose
    sweep declares none, is descriptive only) and the row labels of its ``controls``
    (``{positive: <label>, aa: <label>}``: harness/report/controls.py), where each run's
    primary is ``read`` and, for a primary other than pass/mean/maj@k (any evaluation metric,
    ``<eval set>/<metric>``), which way is ``better``."""

    primary: str | None = None
    alpha: float = 0.05
    power: float = 0.8
    detect: dict[str, float] = field(default_factory=dict)
    controls: dict[str, dict[str, str]] = field(default_factory=dict)
    # where each run's primary is read: ``final`` (its last evaluation) or ``budget`` (its
    # evaluation at the page's common budget of tokens generated, harness/report/budget.py):
    # equal compute, for rows that generate different numbers of tokens per step
    read: str = "final"
    # the primary's direction: None for a quality metric (pass/mean/maj@k: higher is better);
    # ``lower`` or ``higher``, declared, for any other evaluation metric (tool calls per answer)
    better: str | None = None

    def control_labels(self, sweeps: Iterable[str]) -> set[str]:
        """The row labels ``sweeps`` (a board's runs' named sweeps) declare as controls."""
        return {self.controls[s][role] for s in sweeps if s in self.controls
                for role in CONTROL_ROLES}


@dataclass(frozen=True)
class BoardConfig:
    """The pairing, row labels and statistics of a leaderboard (``conf/board/default.yaml``)."""

    baseline: str = "grpo"
    pairs: dict[str, str] = field(default_factory=dict)
    variant: tuple[str, ...] = ("tags.rlbench.variant",)
    select: Selection | None = None
    plan: Plan = field(default_factory=Plan)
    # the command that runs a selection board's sweeps (tuning, then each row at its choice):
    # its Reproduce line, in place of one `rlbench sweep`
    reproduce: str | None = None
    limits: dict[str, str] = field(default_factory=dict)  # sweep -> what its recipe cannot show
    # per named sweep, the response curves its pages draw (declared before the board is read)
    curves: dict[str, tuple[CurveSpec, ...]] = field(default_factory=dict)
    confidence: float = 0.95
    smooth: int = 5
    final_window: int = 10
    source: str = "(built-in defaults)"

    @property
    def interval_options(self) -> tuple[float]:
        """The arguments after the values of :func:`harness.report.stats.interval` (Student-t
        at every n, so the confidence level alone)."""
        return (self.confidence,)


def _run_field(value: object, where: str) -> str:
    text = str(value)
    if not text.startswith(("tags.", "params.")):
        raise BoardError(f"{where}: run fields must start with 'tags.' or 'params.', got "
                         f"{text!r}")
    return text


def load_config(path: str | Path | None = None, variant: tuple[str, ...] = ()) -> BoardConfig:
    """Read a board config (yaml); ``None`` reads ``conf/board/default.yaml`` when it exists.
    ``variant`` adds run fields to the row label (``rlbench board --variant``). Unknown keys and
    malformed values raise :class:`BoardError` naming them."""
    from omegaconf import OmegaConf

    explicit = path is not None
    p = _config_path(Path(path)) if explicit else DEFAULT_CONFIG
    if not p.is_file():
        if explicit:
            raise BoardError(f"board config {str(p)!r} not found")
        return replace(BoardConfig(), variant=(*BoardConfig.variant,
                                               *(_run_field(v, "--variant") for v in variant)))
    raw = OmegaConf.to_container(OmegaConf.load(p), resolve=True) or {}
    if not isinstance(raw, dict):
        raise BoardError(f"board config {p.name}: expected a mapping")
    valid = {f.name for f in fields(BoardConfig)} - {"source"}
    unknown = sorted(set(raw) - valid)
    if unknown:
        raise BoardError(f"board config {p.name}: unknown key(s) {', '.join(unknown)}; valid: "
                         f"{', '.join(sorted(valid))}")
    limits = raw.pop("limits", None) or {}
    if not isinstance(limits, dict) or not all(isinstance(v, str) for v in limits.values()):
        raise BoardError(f"board config {p.name}: limits must map a sweep name (conf/sweep/) to "
                         "a sentence saying what its recipe cannot show")
    pairs = raw.pop("pairs", None) or {}
    if not isinstance(pairs, dict) or not all(isinstance(v, str) for v in pairs.values()):
        raise BoardError(f"board config {p.name}: pairs must map a row name to a baseline name")
    listed = raw.pop("variant", list(BoardConfig.variant))
    listed = [listed] if isinstance(listed, str) else list(listed or [])
    fields_ = tuple(_run_field(v, f"board config {p.name}: variant") for v in listed)
    fields_ += tuple(_run_field(v, "--variant") for v in variant if v not in fields_)
    select = raw.pop("select", None)
    if select is not None:
        if not isinstance(select, dict) or set(select) - {"key", "metric", "higher", "seeds"} \
                or not {"key", "metric"} <= set(select):
            raise BoardError(f"board config {p.name}: select needs key (a run field, e.g. "
                             "params.trainer.optim.lr) and metric (e.g. validation/pass_at_1), "
                             "optionally higher: true|false and seeds: [tuning seeds]")
        select = Selection(_run_field(select["key"], f"board config {p.name}: select.key"),
                           str(select["metric"]), bool(select.get("higher", True)),
                           tuple(str(s) for s in select.get("seeds") or ()))
    plan = _plan(raw.pop("plan", None) or {}, p.name)
    curves = _curves(raw.pop("curves", None) or {}, p.name)
    if not isinstance(raw.get("reproduce") or "", str):
        raise BoardError(f"board config {p.name}: reproduce must be one command line (the "
                         "sweeps' driver), e.g. python benchmarks/offpolicy_testbed.py ...")
    cfg = BoardConfig(**raw, pairs={str(k): v for k, v in pairs.items()}, variant=fields_,
                      select=select, plan=plan, curves=curves,
                      limits={str(k): " ".join(v.split()) for k, v in
                                             limits.items()}, source=_shown_path(p))
    if not 0.0 < cfg.confidence < 1.0:
        raise BoardError(f"board config {p.name}: confidence must be in (0, 1)")
    if cfg.final_window < 1:
        raise BoardError(f"board config {p.name}: final_window must be >= 1")
    return cfg


def _direction(plan: Plan, name: str) -> None:
    """A quality primary is higher-is-better by definition; any other evaluation metric needs
    its direction declared before the board is read, and is read at the last evaluation."""
    quality = plan.primary is None or metric_spec(plan.primary).k > 0
    if plan.better not in (None, "higher", "lower"):
        raise BoardError(f"board config {name}: plan.better must be lower or higher; got "
                         f"{plan.better!r}")
    if quality and plan.better == "lower":
        raise BoardError(f"board config {name}: plan.better: lower with primary "
                         f"{plan.primary or '(the first pass@1)'}, a quality metric (higher is "
                         "better); drop plan.better")
    if not quality and (plan.better is None or "/" not in str(plan.primary).strip("/")):
        raise BoardError(f"board config {name}: plan.primary {plan.primary!r} is not a "
                         "pass/mean/maj@k metric: name it <eval set>/<metric> (e.g. "
                         "heldout/tool_calls_per_traj) and declare plan.better: lower or higher")
    if not quality and plan.read != "final":
        raise BoardError(f"board config {name}: plan.read: {plan.read} reads pass@k at the "
                         f"token budget; primary {plan.primary!r} is read at the last "
                         "evaluation (plan.read: final)")


def _plan(raw: object, name: str) -> Plan:
    keys = {"primary", "alpha", "power", "detect", "controls", "read", "better"}
    if not isinstance(raw, dict) or set(raw) - keys:
        raise BoardError(f"board config {name}: plan takes {', '.join(sorted(keys))}; got "
                         f"{raw!r}")
    detect = raw.get("detect") or {}
    if not isinstance(detect, dict) or not all(
            isinstance(v, (int, float)) and v > 0 for v in detect.values()):
        raise BoardError(f"board config {name}: plan.detect must map a sweep name (conf/sweep/) "
                         "to the effect (> 0, in the primary metric's units) it is powered for")
    plan = Plan(raw.get("primary"), float(raw.get("alpha", 0.05)), float(raw.get("power", 0.8)),
                {str(k): float(v) for k, v in detect.items()},
                _controls(raw.get("controls") or {}, name), str(raw.get("read", "final")),
                None if raw.get("better") is None else str(raw["better"]))
    if plan.read not in ("final", "budget"):
        raise BoardError(f"board config {name}: plan.read must be final (each run's last "
                         "evaluation) or budget (its evaluation at the common token budget); "
                         f"got {plan.read!r}")
    _direction(plan, name)
    if not (0.0 < plan.alpha < 1.0 and 0.0 < plan.power < 1.0):
        raise BoardError(f"board config {name}: plan.alpha and plan.power must be in (0, 1)")
    return plan


def _curves(raw: object, name: str) -> dict[str, tuple[CurveSpec, ...]]:
    """``curves``: per named sweep (conf/sweep/), a list of {name, rows, x, y[, baseline][,
    identity]} (CurveSpec): a page draws the curves of the sweeps its runs came from."""
    need, optional = {"name", "rows", "x", "y"}, {"baseline", "identity"}

    def good(c: object) -> bool:
        return isinstance(c, dict) and need <= set(c) and not set(c) - need - optional \
            and all(isinstance(c[k], str) and c[k] for k in need)

    if not isinstance(raw, dict) or not all(isinstance(v, list) and all(good(c) for c in v)
                                            for v in raw.values()):
        raise BoardError(f"board config {name}: curves must map a sweep name (conf/sweep/) to a "
                         "list of {name, rows (an algorithm), x (a config key, e.g. "
                         "algorithm.rollout.target_entropy), y (a final metric, e.g. "
                         f"token_entropy)[, baseline (a row)][, identity: true]}}; got {raw!r}")
    out = {}
    for sweep, specs in raw.items():
        names = [c["name"] for c in specs]
        if len(set(names)) < len(names):
            raise BoardError(f"board config {name}: curves.{sweep}: two curves named alike in "
                             f"{names}")
        out[str(sweep)] = tuple(CurveSpec(str(c["name"]), str(c["rows"]), str(c["x"]),
                                          str(c["y"]), None if c.get("baseline") is None
                                          else str(c["baseline"]),
                                          bool(c.get("identity", False))) for c in specs)
    return out


def _controls(raw: object, name: str) -> dict[str, dict[str, str]]:
    """``plan.controls``: per named sweep, both control rows by label (a sensitivity check
    needs the two: one the test must see, one it must not), and optionally the ``metric`` they
    are tested on (a final metric, e.g. ``token_entropy``; default the primary) and the
    ``direction`` the positive control must be detected in (``below``, the default: a handicap
    lowers the primary; ``above``: e.g. an entropy bonus raises the entropy)."""
    def bad(value: object) -> bool:
        if not isinstance(value, dict) or not set(CONTROL_ROLES) <= set(value) \
                or not set(value) <= {*CONTROL_ROLES, *CONTROL_OPTIONS}:
            return True
        roles = [value[r] for r in CONTROL_ROLES]
        return not all(isinstance(v, str) and v for v in value.values()) \
            or len(set(roles)) < 2 or value.get("direction", "below") not in ("below", "above")

    if not isinstance(raw, dict) or any(bad(v) for v in raw.values()):
        raise BoardError(f"board config {name}: plan.controls must map a sweep name "
                         "(conf/sweep/) to {positive: <row label>, aa: <row label>}, two "
                         "different rows (e.g. grpo@lr_div10 and grpo@aa), with optional "
                         "metric: <final metric> and direction: below | above; "
                         f"got {raw!r}")
    return {str(k): {key: str(v[key]) for key in (*CONTROL_ROLES, *CONTROL_OPTIONS) if key in v}
            for k, v in raw.items()}


def _config_path(p: Path) -> Path:
    """``p``; a shipped config written as in the repository (``conf/board/x.yaml``, as board
    pages print it) that is not there is read from the installed ``conf/``, so a page's command
    runs outside the checkout too."""
    if not p.is_file() and not p.is_absolute() and p.parts[:1] == ("conf",):
        shipped = CONF_DIR.joinpath(*p.parts[1:])
        if shipped.is_file():
            return shipped
    return p


def _shown_path(p: Path) -> str:
    """A board config's path on the page: ``conf/...`` for a shipped one (wherever rlbench is
    installed), else relative to the checkout, else its name."""
    for base, prefix in ((CONF_DIR.resolve(), "conf/"), (REPO, "")):
        try:
            return prefix + p.resolve().relative_to(base).as_posix()
        except ValueError:
            pass
    return p.name
