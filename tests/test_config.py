"""Config composition, overrides and the one-line errors of the CLI."""

from __future__ import annotations

import shutil

import pytest

from rlft.config import Config, ConfigError, compose, conf_dir, group_options
from tests.support import ALGO_PRESETS, ROOT, TINY, run_cli


def test_defaults_compose_into_typed_config(compose_cfg):
    cfg = compose_cfg()
    assert isinstance(cfg, Config)
    assert cfg.algo.name == "grpo" and cfg.algo.adv_estimator == "grpo"
    assert cfg.model.name == "smollm2_135m" and cfg.model.lora.enabled
    assert cfg.sampler.name == "auto" and cfg.data.name == "arithmetic"


def test_overrides_reach_every_level(compose_cfg):
    cfg = compose_cfg("model=tiny", "algo.beta=0.1", "model.lora.r=4", "optim.lr=1e-3", "seed=7")
    assert (cfg.model.name, cfg.algo.beta, cfg.model.lora.r, cfg.optim.lr, cfg.seed) == ("tiny", 0.1, 4, 1e-3, 7)


def test_run_dir_override():
    _, _, run_dir = compose(["hydra.run.dir=/tmp/somewhere"])
    assert run_dir == "/tmp/somewhere"
    _, _, default = compose([])
    assert default.startswith("outputs/")


def test_conf_found_in_checkout():
    assert conf_dir() == ROOT / "conf"
    assert "grpo" in group_options("algo") and "tiny" in group_options("model")


@pytest.mark.parametrize(
    "override, expected",
    [
        ("algo=grpoo", "unknown algo 'grpoo'; valid choices: " + ALGO_PRESETS),
        ("algo.bta=1", "unknown config key 'algo.bta': no 'bta' in 'algo'; valid keys: name, adv_estimator"),
        ("trainr.steps=1", "unknown config key 'trainr.steps': no 'trainr' in the top level; valid keys: algo"),
        ("trainer.steps=abc", "invalid value for 'trainer.steps'"),
        ("model.lora=3", "invalid value for 'model.lora'"),
        ("model.attn_implementation=flash", "model.attn_implementation='flash'; valid choices: auto, eager, sdpa"),
        ("algo.loss_agg=tokenmean", "algo.loss_agg='tokenmean' is not a known loss aggregation; valid choices"),
        ("reward.weights=[1,2]", "reward.weights has 2 entries but reward.fns has 1"),
        ("algo.num_mini_batches=3", "must divide the rollout batch"),
        ("sampler.n=1", "sampler.n=1: group-relative advantages need at least 2"),
        ("data=jsonl", "data=jsonl needs data.path=FILE"),
    ],
)
def test_bad_config_raises_one_clear_line(override, expected):
    with pytest.raises(ConfigError) as err:
        compose([override])
    assert expected in str(err.value)
    assert "\n" not in str(err.value)


def test_cli_config_error_exits_2_without_traceback(tmp_path):
    proc = run_cli(["train", "algo=grpoo"], cwd=tmp_path)
    assert proc.returncode == 2
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines == ["rlft: error: unknown algo 'grpoo'; valid choices: " + ALGO_PRESETS]
    assert "Traceback" not in proc.stderr + proc.stdout


def test_cli_type_error_exits_2(tmp_path):
    proc = run_cli(["train", "trainer.steps=abc"], cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("rlft: error: invalid value for 'trainer.steps'")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_cli_help_lists_groups(tmp_path):
    proc = run_cli(["train", "--help"], cwd=tmp_path)
    assert proc.returncode == 0
    assert f"algo      {ALGO_PRESETS}" in proc.stdout and "tiny" in proc.stdout


def test_cli_cfg_prints_resolved_config(tmp_path):
    proc = run_cli(["train", "model=tiny", "trainer.steps=3", "trainer.eval_every=${trainer.steps}", "--cfg"],
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "steps: 3" in proc.stdout and "source: tiny" in proc.stdout
    assert "eval_every: 3" in proc.stdout and "${" not in proc.stdout  # resolved, as the README says
    as_written = run_cli(["train", "trainer.eval_every=${trainer.steps}", "--cfg", "job"], cwd=tmp_path)
    assert "eval_every: ${trainer.steps}" in as_written.stdout  # Hydra's own --cfg job is left as Hydra has it


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["sampler=hf", "algo.tis_cap=2"], "only sampler=vllm reports (this run samples with hf)"),
        (["sampler=vllm", "algo.tis_cap=2", "sampler.top_p=0.9"], "algo.tis_cap=2.0 needs untruncated sampling"),
        (["sampler=vllm", "algo.tis_cap=2", "sampler.top_k=20"], "algo.tis_cap=2.0 needs untruncated sampling"),
        (["model.lora.target_modules=[q_proj,lm_head]"], "lm_head cannot carry an adapter"),
        (["model=tiny", "model.path=/some/dir"], "model.path=/some/dir is read only by model.source=path"),
        (["data.num_eval=-1"], "data.num_eval=-1 must be >= 0"),
    ],
)
def test_options_that_would_do_nothing_are_refused(overrides, expected):
    from rlft.config.validation import vllm_available

    if "sampler=vllm" in overrides and not vllm_available():
        pytest.skip("vLLM is not installed")
    with pytest.raises(ConfigError) as err:
        compose(overrides)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_sampler_logprobs_are_compared_only_without_truncation(compose_cfg):
    from rlft.training.rollout import untruncated

    assert untruncated(compose_cfg().sampler)
    assert not untruncated(compose_cfg("sampler.top_p=0.95").sampler)
    assert not untruncated(compose_cfg("sampler.top_k=50").sampler)


@pytest.mark.parametrize(
    "override, expected",
    [
        ("optim.lr=-1", "optim.lr=-1.0 must be > 0"),
        ("optim.lr=0", "optim.lr=0.0 must be > 0"),
        ("optim.lr=nan", "optim.lr=nan must be > 0"),
        ("algo.critic_lr=-1e-4", "algo.critic_lr=-0.0001 must be > 0"),
        ("optim.weight_decay=-0.1", "optim.weight_decay=-0.1 must be >= 0"),
        ("optim.betas=[0.9,1.0]", "optim.betas[1]=1.0 must be in [0, 1)"),
        ("optim.betas=[-0.1,0.99]", "optim.betas[0]=-0.1 must be in [0, 1)"),
        ("optim.betas=[0.9]", "optim.betas=[0.9] must be two values [beta1, beta2]"),
        ("optim.warmup_steps=-1", "optim.warmup_steps=-1 must be >= 0"),
        ("optim.max_grad_norm=-1", "optim.max_grad_norm=-1.0 must be >= 0"),
        ("optim.schedule=cosin", "optim.schedule='cosin'; valid choices: constant, linear, cosine"),
    ],
)
def test_optimizer_values_are_checked_at_config_time(override, expected):
    with pytest.raises(ConfigError) as err:
        compose(["model=tiny", override])
    assert str(err.value) == expected


def test_cli_negative_weight_decay_is_one_line(tmp_path):
    """AdamW's own check raised from inside the run, a traceback through Hydra; now it is refused up front."""
    proc = run_cli(["train", *TINY, "optim.weight_decay=-0.1"], cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "rlft: error: optim.weight_decay=-0.1 must be >= 0"
    assert not (tmp_path / "outputs").exists()


def test_readme_names_every_builtin_reward_and_only_paths_users_have():
    from rlft.rewards.functions import REWARDS

    readme = (ROOT / "README.md").read_text()
    assert [n for n in REWARDS.names() if f"`{n}`" not in readme] == []
    # What users read: the README, the changelog, the guide, the overview and the reference (results*.md gives the
    # developers' commands that reproduce each figure from a checkout).
    pages = [p for p in sorted((ROOT / "docs").rglob("*.md")) if not p.name.startswith("results")]
    for doc in [ROOT / "README.md", ROOT / "CHANGELOG.md", *pages]:
        assert "../shared" not in doc.read_text(), doc  # the developers' data folder


def test_a_preset_that_leaves_a_key_missing_is_refused_until_it_is_given(tmp_path, monkeypatch):
    """A ??? in a preset over a schema default: OmegaConf's merge would keep the default (model.path=None) and
    the run would go on without what the preset asks for."""
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    (conf / "model" / "mine.yaml").write_text("name: mine\nsource: path\npath: ???\n")
    (conf / "experiment" / "mine_done.yaml").write_text("# @package _global_\nmodel:\n  path: /models/mine\n")
    monkeypatch.setenv("RLFT_CONF_DIR", str(conf))
    with pytest.raises(ConfigError, match=r"^missing value for 'model.path': model/mine.yaml sets it to \?\?\? "
                                          r"\(it must be given\); set it on the command line, e.g. model.path=...$"):
        compose(["model=mine"])
    assert compose(["model=mine", "model.path=/models/x"])[0].model.path == "/models/x"
    assert compose(["model=mine", "+experiment=mine_done"])[0].model.path == "/models/mine"  # a later preset gave it
