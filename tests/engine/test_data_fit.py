"""Data that does not fit the model (harness/prompts.py): prompts longer than the context, chat
prompts without a chat template, token ids the embedding lacks, no EOS / no pad token. Each is
one line and exit 2, or handled as configured (cut, dropped), never a traceback; prompt plus
response never exceeds the context (a GPT-2 with 64 learned positions raises IndexError if it
does)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from harness.engines import RolloutEngine
from harness.prompts import ModelLimits, cut, fit_examples, model_limits, prompt_limit
from harness.typed_config import ConfigError
from harness.types import Example

LONG = "What is the answer? Think step by step. "


def gpt2_dir(path: Path, n_positions: int = 64, extra_tokens: int = 0, eos: bool = True,
             chat_template: str | None = None) -> Path:
    """A 1-layer GPT-2 with ``n_positions`` positions and a byte-level BPE tokenizer of its own
    (no pad token, no chat template: as GPT-2's), built here; ``extra_tokens`` added to the
    tokenizer only (an embedding never resized); ``eos=False``: no EOS anywhere."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    corpus = [f"{a}+{b}={a + b}" for a in range(20) for b in range(20)] + [LONG] * 5
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"] if eos else [],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    special = {"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"} if eos else {}
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, **special)
    if chat_template:
        tok.chat_template = chat_template
    vocab = len(tok)
    if extra_tokens:
        tok.add_tokens([f"<extra{i}>" for i in range(extra_tokens)])
    eos_id = tok.eos_token_id if eos else None
    config = GPT2Config(vocab_size=vocab, n_positions=n_positions, n_embd=32, n_layer=1,
                        n_head=2, eos_token_id=eos_id, bos_token_id=eos_id)
    GPT2LMHeadModel(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gpt2_dir(tmp_path_factory.mktemp("gpt2") / "gpt2_64")


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def byo(tmp_path: Path) -> Path:
    """Prompts (row 3 far longer than 64 tokens), chat prompts as verl's parquet has them, and a
    reward function in a file."""
    rows = [{"prompt": LONG * (12 if i == 3 else 1) + f"{i}+1=", "answer": i + 1}
            for i in range(8)]
    _jsonl(tmp_path / "train.jsonl", rows)
    _jsonl(tmp_path / "test.jsonl", rows[:4])
    _jsonl(tmp_path / "chat.jsonl", [{"prompt": [{"role": "user", "content": f"{i}+2="}],
                                      "reward_model": {"ground_truth": str(i + 2)}}
                                     for i in range(6)])
    _jsonl(tmp_path / "extra.jsonl", [{"prompt": f"{i}+1=<extra1>", "answer": i + 1}
                                      for i in range(4)])
    (tmp_path / "rew.py").write_text(
        "def reward(prompts, completions, answer, **kw):\n"
        "    return [float(str(a) in c) for c, a in zip(completions, answer)]\n")
    return tmp_path


def _rlbench(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def _train_args(model: Path, *extra: str) -> list[str]:
    return ["train", "algorithm=grpo", "model=hf", f"model.path={model}", "task=custom",
            "task.reward.fn=rew.py:reward", "task.max_new_tokens=8", "trainer.steps=2",
            "trainer.eval_every=2", "data.prompts_per_step=4", "rollout.n=2",
            "backend.threads=1", "trainer.status_every=0", *extra]


def _setup(byo: Path, model: Path, monkeypatch: pytest.MonkeyPatch, *extra: str) -> None:
    """``Trainer.setup`` of the run :func:`_train_args` describes, in this process, MLflow off:
    where ``rlbench train`` checks every prompt against the model. Its refusals are the
    :class:`ConfigError` s this raises; that the command line turns one into a single line and
    exit 2 is checked end to end by the first test below."""
    from harness.cli import compose_config
    from harness.trainer import Trainer

    monkeypatch.chdir(byo)  # task.reward.fn=rew.py:reward, as the command line finds it
    cfg = compose_config([*_train_args(model, *extra)[1:], "tracking.enabled=false",
                          f"trainer.output_dir={byo / 'out'}"])
    Trainer(cfg).setup()


def _refusal(byo: Path, model: Path, monkeypatch: pytest.MonkeyPatch, *extra: str,
             needles: tuple[str, ...]) -> str:
    with pytest.raises(ConfigError) as exc:
        _setup(byo, model, monkeypatch, *extra)
    message = str(exc.value)
    assert "\n" not in message, message
    for needle in needles:
        assert needle in message, message
    return message


def _one_line_refusal(proc: subprocess.CompletedProcess, *needles: str) -> str:
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("rlbench: error:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# -- end to end: the situations of a user bringing a GPT-2 with 64 positions -------------------

@pytest.mark.slow
def test_a_prompt_longer_than_the_context_is_refused_naming_row_length_and_limit(
        byo, gpt2, cli_env):
    proc = _rlbench(byo, cli_env, *_train_args(gpt2, "task.train=train.jsonl"))
    _one_line_refusal(proc, "task.train row 3", "over the prompt limit of 56",
                      "context 64", "data.truncation=left|right|middle",
                      "data.filter_overlong_prompts=true")


@pytest.mark.slow
def test_overlong_prompts_cut_on_the_left_train_within_the_context_and_are_counted(
        byo, gpt2, cli_env):
    from mlflow.tracking import MlflowClient

    proc = _rlbench(byo, cli_env, *_train_args(
        gpt2, "task.train=train.jsonl", "+task.eval.test.path=test.jsonl",
        "data.truncation=left", f"trainer.output_dir={byo / 'out'}"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "task.train: 1 of 8 prompts are over the prompt limit of 56 tokens" in proc.stderr
    assert "eval set 'test': 1 of 4 prompts are over" in proc.stderr
    run_id = json.loads((byo / "out" / "logged.json").read_text())["run_id"]
    metrics = MlflowClient(cli_env["MLFLOW_TRACKING_URI"]).get_run(run_id).data.metrics
    assert metrics["data/train/prompts_truncated"] == 1.0
    assert metrics["data/train/prompts"] == 8.0 and metrics["data/test/prompts"] == 4.0
    assert metrics["final/steps"] == 2.0
    # rlbench eval of the run fits its prompts as the run did (data.* comes from the run)
    again = _rlbench(byo, cli_env, "eval", f"run_id={run_id}", "backend.threads=1")
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout[again.stdout.index("{"):])["data/test/prompts_truncated"] == 1


def test_a_run_that_never_evaluates_does_not_refuse_its_eval_sets(byo, gpt2, monkeypatch):
    _jsonl(byo / "short.jsonl", [{"prompt": f"{i}+1=", "answer": i + 1} for i in range(4)])
    _setup(byo, gpt2, monkeypatch, "task.train=short.jsonl", "+task.eval.test.path=test.jsonl",
           "trainer.eval_every=0", "trainer.eval_at_start=false")
    with pytest.raises(ConfigError, match="eval set 'test' row 3"):  # the same run, evaluating
        _setup(byo, gpt2, monkeypatch, "task.train=short.jsonl",
               "+task.eval.test.path=test.jsonl")


def test_overlong_eval_prompts_are_dropped_and_counted_when_filtered(byo, gpt2, cli_env,
                                                                     rlbench_in_process):
    proc = rlbench_in_process("eval", "model=hf", f"model.path={gpt2}", "task=custom",
                    "task.train=train.jsonl", "task.reward.fn=rew.py:reward",
                    "+task.eval.test.path=test.jsonl", "task.max_new_tokens=8",
                    "data.filter_overlong_prompts=true", "backend.threads=1",
                    cwd=byo, env=cli_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "eval set 'test': 1 of 4 prompts are over the prompt limit" in proc.stderr
    assert "dropped" in proc.stderr
    out = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert out["data/test/prompts_dropped"] == 1.0 and out["eval/test/samples"] == 3 * 4


def test_an_overlong_eval_prompt_is_refused_by_rlbench_eval(byo, gpt2, cli_env,
                                                           rlbench_in_process):
    proc = rlbench_in_process("eval", "model=hf", f"model.path={gpt2}", "task=custom",
                    "task.train=train.jsonl", "task.reward.fn=rew.py:reward",
                    "+task.eval.test.path=test.jsonl", "task.max_new_tokens=8",
                    "backend.threads=1", cwd=byo, env=cli_env)
    _one_line_refusal(proc, "eval set 'test' row 3", "over the prompt limit of 56")


def test_chat_prompts_without_a_chat_template_are_refused_naming_the_fix(byo, gpt2,
                                                                          monkeypatch):
    args = ("task.train=chat.jsonl", "task.columns.answer=reward_model.ground_truth")
    _refusal(byo, gpt2, monkeypatch, *args,
             needles=("task.train row 0", "no chat template", "model.chat_template="))
    template = "model.chat_template='{% for m in messages %}{{ m.content }}{% endfor %}'"
    _setup(byo, gpt2, monkeypatch, *args, template)


def test_response_length_that_leaves_no_room_or_overflows_the_context_is_refused(
        byo, gpt2, monkeypatch):
    _refusal(byo, gpt2, monkeypatch, "task.train=train.jsonl", "rollout.max_new_tokens=64",
             needles=("rollout.max_new_tokens=64 leaves no room for a prompt", "context is 64"))
    _refusal(byo, gpt2, monkeypatch, "task.train=train.jsonl", "data.max_prompt_length=60",
             needles=("data.max_prompt_length=60 plus rollout.max_new_tokens=8 is 68 tokens",
                      "data.max_prompt_length <= 56"))


def test_token_ids_the_embedding_lacks_and_a_missing_eos_are_refused(byo, tmp_path,
                                                                      monkeypatch):
    extra = gpt2_dir(tmp_path / "extra", extra_tokens=3)
    _refusal(byo, extra, monkeypatch, "task.train=extra.jsonl",
             needles=("task.train row 0", "token id 301", "(300 rows)",
                      "resize_token_embeddings"))
    no_eos = gpt2_dir(tmp_path / "noeos", eos=False)
    _refusal(byo, no_eos, monkeypatch, "task.train=extra.jsonl",
             needles=("has no EOS token", "eos_token"))


# -- the rules, unit by unit --------------------------------------------------------------------

def test_cut_keeps_the_end_the_start_or_both_ends():
    ids = list(range(10))
    assert cut(ids, 4, "left") == [6, 7, 8, 9]
    assert cut(ids, 4, "right") == [0, 1, 2, 3]
    assert cut(ids, 5, "middle") == [0, 1, 7, 8, 9]


def test_prompt_limit_is_the_context_minus_the_response_unless_declared():
    limits = ModelLimits(64, "n_positions", 300, "m")
    assert prompt_limit(limits, None, 8, "rollout.max_new_tokens") == 56
    assert prompt_limit(limits, 40, 8, "rollout.max_new_tokens") == 40
    assert prompt_limit(ModelLimits(None, "", None, "m"), 40, 8, "k") == 40
    assert prompt_limit(ModelLimits(None, "", None, "m"), None, 8, "k") is None
    with pytest.raises(ConfigError, match=r"data\.max_prompt_length <= 56"):
        prompt_limit(limits, 57, 8, "rollout.max_new_tokens")
    with pytest.raises(ConfigError, match="leaves no room"):
        prompt_limit(limits, None, 64, "rollout.max_new_tokens")


def test_the_context_comes_from_the_model_config_else_the_tokenizer(gpt2, monkeypatch):
    limits = model_limits(str(gpt2), SimpleNamespace(model_max_length=10**30))
    assert (limits.context, limits.vocab) == (64, 300)  # GPT-2's n_positions
    assert "max_position_embeddings" in limits.context_source
    import transformers

    bare = SimpleNamespace(vocab_size=50)  # a config that names no context
    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", lambda path: bare)
    assert model_limits("m", SimpleNamespace(model_max_length=32)).context == 32
    assert model_limits("m", SimpleNamespace(model_max_length=10**30)).context is None


class _Engine(RolloutEngine):
    """Encodes a prompt as one id per character (ids = ord)."""

    def __init__(self, chat_template: str | None = "x") -> None:
        self.tokenizer = SimpleNamespace(chat_template=chat_template)

    def encode_prompt(self, ex: Example) -> list[int]:
        if ex.prompt_ids is not None:
            return list(ex.prompt_ids)
        text = ex.prompt if isinstance(ex.prompt, str) else "".join(
            m["content"] for m in ex.prompt)
        return [ord(c) for c in text]


def _data(truncation: str = "error", filt: bool = False) -> SimpleNamespace:
    return SimpleNamespace(truncation=truncation, filter_overlong_prompts=filt,
                           max_prompt_length=None)


def test_fitting_cuts_drops_or_refuses_exactly_the_overlong_prompts():
    limits = ModelLimits(16, "ctx", 1000, "m")
    exs = [Example("a", "short"), Example("b", "x" * 12 + "tail"), Example("c", "y" * 20)]
    kept, counts = fit_examples(exs, _Engine(), limits, 8, _data("left"), "task.train", "w")
    assert [k.id for k in kept] == ["a", "b", "c"] and counts["prompts_truncated"] == 2
    assert kept[0] is exs[0] and kept[1].prompt_ids == [ord(c) for c in "xxxxtail"]
    assert exs[1].prompt_ids is None  # the task's own example is left as it was
    kept, counts = fit_examples(exs, _Engine(), limits, 8, _data(filt=True), "task.train", "w")
    assert [k.id for k in kept] == ["a"] and counts["prompts_dropped"] == 2
    # filtering comes first, whatever data.truncation says (verl's order)
    kept, counts = fit_examples(exs, _Engine(), limits, 8, _data("left", filt=True),
                                "task.train", "w")
    assert [k.id for k in kept] == ["a"] and counts["prompts_truncated"] == 0
    with pytest.raises(ConfigError, match=r"row 1 \(id 'b'\) is 16 tokens, over the prompt "
                                          r"limit of 8 \(w\) \(and 1 more\)"):
        fit_examples(exs, _Engine(), limits, 8, _data(), "task.train", "w")
    with pytest.raises(ConfigError, match="drops them all"):
        fit_examples(exs[1:], _Engine(), limits, 8, _data(filt=True), "task.train", "w")


def test_a_prompt_with_images_is_never_cut():
    ex = Example("img", "z" * 20, images=["pixels"])
    with pytest.raises(ConfigError, match="cannot be cut"):
        fit_examples([ex], _Engine(), ModelLimits(16, "c", None, "m"), 8, _data("left"),
                     "task.train", "w")


def test_the_hf_engine_samples_a_cut_prompt_from_its_ids(tiny_model_path):
    from omegaconf import OmegaConf

    from harness.backends.hf import HFEngine
    from harness.config import BackendConfig

    engine = HFEngine(tiny_model_path, OmegaConf.structured(BackendConfig(threads=1)), 0)
    ex = Example("e", "2+3=", prompt_ids=[5, 6, 7])
    assert engine.encode_prompt(ex) == [5, 6, 7]
    assert engine.encode_prompt(Example("e", "2+3=")) != [5, 6, 7]


def test_a_tokenizer_without_pad_pads_with_eos_and_says_so(gpt2, caplog):
    from omegaconf import OmegaConf

    from harness.backends.hf import HFEngine
    from harness.config import BackendConfig
    from harness.prompts import check_special_tokens

    engine = HFEngine(str(gpt2), OmegaConf.structured(BackendConfig(threads=1)), 0)
    with caplog.at_level(logging.WARNING, logger="rlbench"):
        check_special_tokens(engine, model_limits(str(gpt2), engine.tokenizer))
    assert engine.pad_token_id == engine.tokenizer.eos_token_id
    assert "has no pad token: padding with EOS" in caplog.text


def test_a_multi_turn_task_reserves_its_whole_response_side_plus_one_segment(monkeypatch):
    """A multi-turn segment of up to max_new_tokens is sampled after as many as
    max_total_tokens - 1 response tokens (then cut): the prompt limit leaves room for both."""
    import harness.prompts as prompts
    from harness.task import EvalProtocol, EvalSet

    monkeypatch.setattr(prompts, "model_limits",
                        lambda path, tok: ModelLimits(64, "ctx", 1000, path))
    engine = _Engine()
    engine.tokenizer.pad_token_id, engine.eos_token_ids, engine.pad_token_id = 0, [0], 0
    exs = [Example(str(n), "x" * n) for n in (30, 36, 37)]
    task = SimpleNamespace(
        tool_env=lambda: SimpleNamespace(max_total_tokens=20),
        train_examples=lambda: exs,
        eval_sets=lambda: [EvalSet("dev", exs, EvalProtocol(max_new_tokens=4))])
    cfg = SimpleNamespace(data=SimpleNamespace(truncation="error", filter_overlong_prompts=True,
                                               max_prompt_length=None),
                          rollout=SimpleNamespace(max_new_tokens=8))
    data = prompts.fit_data(cfg, engine, "m", task)
    assert [e.id for e in data.train] == ["30", "36"]  # limit 64 - (20 + 8) = 36
    assert [e.id for e in data.eval_sets[0].examples] == ["30", "36", "37"]  # 64 - (20 + 4)
    assert data.metrics["data/train/prompts_dropped"] == 1.0


def test_an_eos_or_pad_id_beyond_the_embedding_is_refused():
    from harness.prompts import check_special_tokens

    engine = SimpleNamespace(eos_token_ids=[7], pad_token_id=7,
                             tokenizer=SimpleNamespace(pad_token_id=7, eos_token="e"))
    check_special_tokens(engine, ModelLimits(64, "c", 8, "m"))
    with pytest.raises(ConfigError, match="EOS token id 7 .* not a row of the model's embedding "
                                          r"\(7 rows\)"):
        check_special_tokens(engine, ModelLimits(64, "c", 7, "m"))
    engine.eos_token_ids = []
    with pytest.raises(ConfigError, match="has no EOS token"):
        check_special_tokens(engine, ModelLimits(64, "c", 8, "m"))


@pytest.mark.parametrize(("override", "message"), [
    ("data.truncation=both", "data.truncation='both' is not one of: error, left, right, middle"),
    ("data.max_prompt_length=0", "data.max_prompt_length must be >= 1, got 0")])
def test_bad_data_keys_are_refused_before_anything_is_built(override, message):
    from harness.cli import compose_config
    from harness.config import validate_config

    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        validate_config(compose_config([override]))


def test_a_cut_prompt_changes_the_logged_dataset_digest_and_an_uncut_one_does_not():
    from harness.task import example_bytes

    ex = Example("a", "x" * 12)
    assert example_bytes(ex) == example_bytes(Example("a", "x" * 12))
    cut_ex = fit_examples([ex], _Engine(), ModelLimits(16, "c", 1000, "m"), 8, _data("left"),
                          "task.train", "w")[0][0]
    assert example_bytes(cut_ex) != example_bytes(ex)
