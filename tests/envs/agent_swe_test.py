"""The agent loop and demonstration rendering on real mini-SWE environments (git repo, sandbox,
pytest verifier): a policy that types the scripted solution earns reward 1 through the loop."""

import pytest

from configs import common
from thundersync_jax.envs import agent_demos, agent_loop, chat
from thundersync_jax.envs.swe import factory
from thundersync_jax.envs.trajectory import EpisodeIds, LoopLimits, Sample
from thundersync_jax.models import tokenizer


class DemoPolicySampler:
    """Answers turn j with the environment's j-th demonstration call, rendered by the template."""

    def __init__(self, tok, calls):
        self.tok, self.calls = tok, calls
        self.fmt = chat.get_format(tok)

    def sample(self, prompt_tokens, key_ids, max_new_tokens):
        text = self.fmt.assistant_text("", [self.calls[key_ids.turn]]) + self.fmt.end_of_turn
        ids = self.tok.encode(text)[:max_new_tokens]
        return Sample(ids, [0.0] * len(ids), "stop", 0)


@pytest.fixture(scope="module")
def swe(tmp_path_factory):
    cfg = common.get_base_config()
    cfg.env.num_tasks, cfg.env.difficulty = 1, "easy"
    workdir = str(tmp_path_factory.mktemp("swe"))
    tasks = factory.load_instances(cfg.env, workdir, seed=0)
    return cfg, workdir, tasks


def test_demonstrations_render_solved_and_compact_is_shorter(swe):
    cfg, workdir, tasks = swe
    makers = [lambda t=t: factory.make_environment(t, workdir, cfg.env) for t in tasks]
    lengths = {}
    for chat_format, budget in (("compact", cfg.rollout.max_traj_tokens), ("qwen3", 4096)):
        tok = tokenizer.ByteTokenizer(chat_format=chat_format)
        limits = LoopLimits(max_traj_tokens=budget)
        (ex,) = agent_demos.demonstration_examples(makers, tok, limits)
        assert ex.reward == 1.0 and ex.complete and len(ex.tokens) <= budget
        assert 0 < ex.loss_mask.sum() < len(ex.tokens)
        lengths[chat_format] = len(ex.tokens)
    # Byte-level Qwen3 transcripts (JSON tool schemas, long role headers) are over twice as long.
    assert 2 * lengths["compact"] < lengths["qwen3"], lengths


def test_scripted_solution_through_the_loop_earns_reward(swe):
    cfg, workdir, tasks = swe
    tok = tokenizer.ByteTokenizer()
    # An edit call of a mini-SWE fix is up to ~180 byte tokens; hard tasks take 7 turns.
    limits = LoopLimits(max_turns=8, max_new_tokens_per_turn=256, max_traj_tokens=2048)
    for k, task in enumerate(tasks):
        with factory.make_environment(task, workdir, cfg.env) as env:
            calls = env.demonstration()
            assert len(calls) <= limits.max_turns
            traj = agent_loop.run_episode(
                env, DemoPolicySampler(tok, calls), tok, EpisodeIds(0, 0, k, 0), limits
            )
        assert traj.stop_reason == "done" and traj.reward == 1.0, traj.verifier
        assert len(traj.turns) == len(calls)
        assert all(t.num_errors == 0 for t in traj.turns)
        assert len(traj.tokens) <= limits.max_traj_tokens
