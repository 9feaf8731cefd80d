"""The agent loop: bookkeeping against the chat template, limits, malformed calls, the per-turn
hook, and a real tiny Qwen3 sampling through `sampling.generate` concurrently and keyed."""

import threading

import jax
import numpy as np
import pytest
from flax import nnx

from configs import common
from thundersync_jax.envs import agent_loop, chat, tool_calls
from thundersync_jax.envs.agent_samplers import EngineSampler, GenerateSampler
from thundersync_jax.envs.base import Environment, StepResult, ToolCall, ToolSpec, VerifierResult
from thundersync_jax.envs.trajectory import EpisodeIds, LoopLimits, Sample
from thundersync_jax.models import qwen3, sampling, tokenizer
from thundersync_jax.rollout.client import EngineClient
from thundersync_jax.rollout.embedded import EmbeddedEngine
from thundersync_jax.rollout.server import RolloutServer


class CounterEnv(Environment):
    """Bring a counter from 0 to a target with add(amount) calls, then submit."""

    tools = (
        ToolSpec("add", "Add an integer to the counter.", {"amount": "integer"}),
        ToolSpec("submit", "Finish the episode.", {}),
    )

    def __init__(self, target: int, loud: int = 0):
        self.task_id = f"counter-{target}"
        self.target, self.loud, self.counter = target, loud, 0
        self.closed = False

    def reset(self) -> str:
        self.counter = 0
        return f"Make the counter equal {self.target}."

    def step(self, call: ToolCall) -> StepResult:
        if call.name == "submit":
            return StepResult("submitted", done=True)
        try:
            amount = int(call.arguments["amount"])
        except (TypeError, ValueError):
            return StepResult(f"error: amount must be an integer, got {call.arguments['amount']!r}")
        self.counter += amount
        return StepResult(f"counter={self.counter}" + "!" * self.loud)

    def verify(self) -> VerifierResult:
        return VerifierResult(float(self.counter == self.target), f"counter={self.counter}")

    def demonstration(self) -> list[ToolCall]:
        return [ToolCall("add", {"amount": self.target}), ToolCall("submit", {})]

    def close(self) -> None:
        self.closed = True


class ScriptedSampler:
    """A hand-written policy: turn j answers `texts[j]` (cut at max_new_tokens) with made-up
    log-probs, and records every prompt it was given."""

    def __init__(self, tok, texts, version=3):
        self.tok, self.texts, self.version = tok, texts, version
        self.prompts = []

    def sample(self, prompt_tokens, key_ids, max_new_tokens):
        self.prompts.append(list(prompt_tokens))
        ids = self.tok.encode(self.texts[key_ids.turn]) + [self.tok.stop_ids[0]]
        ids = ids[:max_new_tokens]
        finish = "stop" if ids[-1] in self.tok.stop_ids else "length"
        logprobs = [-(k + 1) / 64 for k in range(len(ids))]
        return Sample(ids, logprobs, finish, self.version)


MALFORMED_POLICY = [
    '<tool_call>{"name": "add", "arguments": {"amount": </tool_call>',
    '<tool_call>{"name": "mul", "arguments": {}}</tool_call>',
    "I am thinking out loud.",
    '<tool_call>{"name": "add", "arguments": {"amount": "x"}}</tool_call>'
    '<tool_call>{"name": "add", "arguments": {"amount": 5}}</tool_call>',
    '<tool_call>{"name": "submit", "arguments": {}}</tool_call>'
    '<tool_call>{"name": "add", "arguments": {"amount": 1}}</tool_call>',
]
IDS = EpisodeIds(seed=0, step=1, prompt=2, member=3)


@pytest.fixture(scope="module")
def bpe_tok(tmp_path_factory):
    """A subword (HF) tokenizer with Qwen3's markers, trained here on the policy's text."""
    corpus = MALFORMED_POLICY * 4 + ["Make the counter equal 5. counter=5 error: submitted"]
    return tokenizer.train_bpe(corpus, str(tmp_path_factory.mktemp("bpe")), vocab_size=331)


@pytest.mark.parametrize("kind", ["byte-compact", "byte-qwen3", "bpe-qwen3"])
def test_episode_bookkeeping_matches_template(kind, request):
    if kind == "bpe-qwen3":
        tok = request.getfixturevalue("bpe_tok")
    else:
        tok = tokenizer.ByteTokenizer(chat_format=kind.split("-")[1])
    fmt = chat.get_format(tok)
    env = CounterEnv(5)
    sampler = ScriptedSampler(tok, MALFORMED_POLICY)
    traj = agent_loop.run_episode(env, sampler, tok, IDS, LoopLimits(max_turns=8))

    assert traj.stop_reason == "done" and traj.reward == 1.0 and env.counter == 5
    obs = [t.observations for t in traj.turns]
    assert "not valid JSON" in obs[0][0]
    assert obs[1] == ["error: unknown tool 'mul'; tools: add, submit"]
    assert obs[2] == [tool_calls.no_call_error(CounterEnv.tools)]
    assert obs[3] == ["error: amount must be an integer, got 'x'", "counter=5"]
    assert obs[4] == ["submitted"]  # the add after submit never ran
    assert [t.num_errors for t in traj.turns] == [1, 1, 1, 0, 0]

    # The token sequence is exactly the template's rendering of the conversation.
    messages = [chat.Message("user", env.reset())]
    for t in traj.turns:
        messages.append(chat.Message("assistant", t.text))
        if t.index < len(traj.turns) - 1:
            messages += [chat.Message("tool", o) for o in t.observations]
    assert tok.decode(traj.tokens) + fmt.after_turn == fmt.render(messages, CounterEnv.tools)

    # Each turn's prompt is the prefix before it; the mask covers sampled tokens only.
    mask = np.zeros(len(traj.tokens), bool)
    for t, prompt in zip(traj.turns, sampler.prompts, strict=True):
        assert prompt == traj.tokens[: t.start].tolist()
        assert traj.tokens[t.start : t.end].tolist() == t.tokens
        np.testing.assert_array_equal(traj.logprobs[t.start : t.end], np.float32(t.logprobs))
        mask[t.start : t.end] = True
        assert t.sample_start <= t.sample_end <= t.tool_start <= t.tool_end
    np.testing.assert_array_equal(traj.loss_mask, mask)
    assert np.all(traj.logprobs[~mask] == 0)
    assert traj.num_tokens == sum(len(t.tokens) for t in traj.turns)
    assert traj.policy_version == 3 and traj.prompt_len == traj.turns[0].start
    assert traj.start_time <= traj.verify_start <= traj.verify_end == traj.end_time
    positions = np.arange(len(mask))
    turn1 = (positions >= traj.turns[1].start) & (positions < traj.turns[1].end)
    np.testing.assert_array_equal(traj.turn_mask(1), turn1)


def test_turn_limit_and_length_cut():
    tok = tokenizer.ByteTokenizer()
    im_end = tok.special_ids["<|im_end|>"]
    limits = LoopLimits(max_turns=2, max_new_tokens_per_turn=10)
    sampler = ScriptedSampler(tok, ["a long answer without any call"] * 3)
    traj = agent_loop.run_episode(CounterEnv(1), sampler, tok, IDS, limits)
    assert traj.stop_reason == "max_turns" and len(traj.turns) == 2 and traj.reward == 0.0
    for t in traj.turns:
        assert len(t.tokens) == 10 and t.finish_reason == "length"
        # The loop closes a cut turn with an end-of-turn marker the model did not sample.
        assert traj.tokens[t.end] == im_end and not traj.loss_mask[t.end]
    assert traj.tokens[-1] == im_end and len(traj.tokens) == traj.turns[-1].end + 1


def test_error_turn_limit_stops_only_a_run_of_error_turns():
    tok = tokenizer.ByteTokenizer()
    # Turns 0-2 hold no well-formed call; turn 3 has one (next to a bad one); turn 4 submits.
    stopped = agent_loop.run_episode(
        CounterEnv(5),
        ScriptedSampler(tok, MALFORMED_POLICY),
        tok,
        IDS,
        LoopLimits(max_turns=8, max_error_turns=3),
    )
    assert stopped.stop_reason == "errors" and len(stopped.turns) == 3
    assert stopped.reward == 0.0  # still verified
    assert stopped.tokens[-1] == tok.special_ids["<|im_end|>"]  # no tool results after it

    for limit in (0, 4):  # no limit, or one the run never reaches: the episode plays out
        full = agent_loop.run_episode(
            CounterEnv(5),
            ScriptedSampler(tok, MALFORMED_POLICY),
            tok,
            IDS,
            LoopLimits(max_turns=8, max_error_turns=limit),
        )
        assert full.stop_reason == "done" and len(full.turns) == 5 and full.reward == 1.0
    # A well-formed call the environment refuses ("error: ...") is an error turn too.
    refused = agent_loop.run_episode(
        CounterEnv(5),
        ScriptedSampler(tok, [MALFORMED_POLICY[3].split("</tool_call>")[0] + "</tool_call>"] * 3),
        tok,
        IDS,
        LoopLimits(max_turns=3, max_error_turns=1),
    )
    assert refused.stop_reason == "errors" and len(refused.turns) == 1
    assert refused.turns[0].observations[0].startswith(agent_loop.ERROR_PREFIX)
    with pytest.raises(ValueError, match="max_error_turns"):
        LoopLimits(max_error_turns=-1)


def test_observations_truncated_to_fit_budget():
    tok = tokenizer.ByteTokenizer()
    limits = LoopLimits(max_turns=20, max_new_tokens_per_turn=80, max_traj_tokens=400)
    policy = ['<tool_call>{"name": "add", "arguments": {"amount": 1}}</tool_call>'] * 20
    sampler = ScriptedSampler(tok, policy)
    statement_env = CounterEnv(3, loud=5000)
    traj = agent_loop.run_episode(statement_env, sampler, tok, IDS, limits)
    assert traj.stop_reason == "max_tokens"
    assert len(traj.tokens) <= limits.max_traj_tokens
    text = tok.decode(traj.tokens)
    assert "chars truncated ...]" in text and "counter=1!" in text
    for prompt in sampler.prompts:  # every turn started with room for min_turn_tokens
        assert limits.max_traj_tokens - len(prompt) > limits.min_turn_tokens


def test_huge_statement_is_truncated_into_the_prompt():
    class Wordy(CounterEnv):
        def reset(self):
            return "goal: counter 2. " + "details " * 10_000 + "end of task"

    tok = tokenizer.ByteTokenizer()
    limits = LoopLimits(max_turns=1, max_traj_tokens=200)
    sampler = ScriptedSampler(tok, ["done"])
    traj = agent_loop.run_episode(Wordy(2), sampler, tok, IDS, limits)
    prompt = tok.decode(traj.tokens[: traj.prompt_len])
    assert "goal: counter 2." in prompt and "end of task" in prompt and "truncated" in prompt
    assert traj.prompt_len <= 200 - limits.min_turn_tokens


def test_on_turn_sees_each_turn_before_its_tools_run():
    tok = tokenizer.ByteTokenizer()
    env = CounterEnv(2)
    policy = ['<tool_call>{"name": "add", "arguments": {"amount": 1}}</tool_call>'] * 2 + [
        '<tool_call>{"name": "submit", "arguments": {}}</tool_call>'
    ]
    seen = []

    def on_turn(partial, turn):
        seen.append((partial, turn.index, env.counter, turn.tool_start))

    traj = agent_loop.run_episode(env, ScriptedSampler(tok, policy), tok, IDS, on_turn=on_turn)
    assert [(j, c, ts) for _, j, c, ts in seen] == [(0, 0, None), (1, 1, None), (2, 2, None)]
    for partial, j, _, _ in seen:
        turn = traj.turns[j]
        assert partial.reward is None and partial.stop_reason == ""
        assert len(partial.tokens) == turn.end  # ends with the turn just sampled
        np.testing.assert_array_equal(partial.tokens, traj.tokens[: turn.end])
        np.testing.assert_array_equal(partial.loss_mask, traj.loss_mask[: turn.end])


def test_environment_bugs_become_observations_and_zero_reward():
    class Buggy(CounterEnv):
        def step(self, call):
            raise RuntimeError("boom")

        def verify(self):
            raise KeyError("no result")

    tok = tokenizer.ByteTokenizer()
    policy = ['<tool_call>{"name": "add", "arguments": {"amount": 1}}</tool_call>']
    limits = LoopLimits(max_turns=1)
    traj = agent_loop.run_episode(Buggy(1), ScriptedSampler(tok, policy), tok, IDS, limits)
    assert traj.turns[0].observations == ["error: tool add failed: RuntimeError: boom"]
    assert traj.reward == 0.0 and "KeyError" in traj.verifier.error


def test_sampler_breaking_the_contract_raises():
    tok = tokenizer.ByteTokenizer()

    class Overlong(ScriptedSampler):
        def sample(self, prompt_tokens, key_ids, max_new_tokens):
            s = super().sample(prompt_tokens, key_ids, 10**6)
            return s._replace(tokens=s.tokens * 50, logprobs=s.logprobs * 50)

    with pytest.raises(ValueError, match="over max_new_tokens"):
        agent_loop.run_episode(CounterEnv(1), Overlong(tok, ["x" * 10]), tok, IDS)


def test_run_episodes_closes_envs_and_raises_a_failed_episode():
    tok = tokenizer.ByteTokenizer()
    submit = ['<tool_call>{"name": "submit", "arguments": {}}</tool_call>']

    class FailsOnPrompt1(ScriptedSampler):
        def sample(self, prompt_tokens, key_ids, max_new_tokens):
            if key_ids.prompt == 1:
                raise ConnectionError("engine went away")
            return super().sample(prompt_tokens, key_ids, max_new_tokens)

    made = []

    def make(k):
        made.append(CounterEnv(0))
        return made[-1]

    episodes = [agent_loop.Episode(lambda k=k: make(k), EpisodeIds(0, 0, k, 0)) for k in range(3)]
    sampler = FailsOnPrompt1(tok, submit)
    with pytest.raises(ConnectionError, match="engine went away"):
        list(agent_loop.run_episodes(episodes, sampler, tok, max_concurrency=1))
    assert len(made) >= 2 and all(env.closed for env in made)
    ok = list(agent_loop.run_episodes(episodes[:1], sampler, tok))
    assert [t.reward for t in ok] == [1.0]


def test_generate_sampler_reports_failures_and_refuses_after_close():
    sp = sampling.SamplingParams(max_new_tokens=4)
    key = EpisodeIds(0, 0, 0, 0).turn_key(0)
    with GenerateSampler(None, sp, pad_id=0) as s:  # no model: every generate call fails
        # The failure reaches the waiting episode instead of hanging it.
        with pytest.raises(AttributeError):
            s.sample([1, 2, 3], key, 4)
    with pytest.raises(RuntimeError, match="closed"):
        s.sample([1, 2, 3], key, 4)


# --- the real tiny model --------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model():
    cfg = qwen3.Qwen3Config.from_config_dict(common.tiny_qwen3_model())
    return qwen3.Qwen3(cfg, rngs=nnx.Rngs(7))


def _episodes(n_prompts, n_members, step=0):
    return [
        agent_loop.Episode(lambda k=k: CounterEnv(k + 1), EpisodeIds(0, step, k, i))
        for k in range(n_prompts)
        for i in range(n_members)
    ]


TINY_LIMITS = LoopLimits(
    max_turns=3, max_new_tokens_per_turn=8, max_traj_tokens=128, min_turn_tokens=4
)
TINY_SYSTEM = "You are an agent that controls a counter."


def _run_all(sampler, episodes, on_turn=None):
    tok = tokenizer.ByteTokenizer()
    return list(
        agent_loop.run_episodes(episodes, sampler, tok, TINY_LIMITS, TINY_SYSTEM, on_turn, 4)
    )


@pytest.fixture(scope="module")
def generate_runs(tiny_model):
    """Four episodes through `sampling.generate`, in two arrival orders; sized so every turn's
    prompt lands in one generate shape bucket (one compilation)."""
    tok = tokenizer.ByteTokenizer()
    sp = sampling.SamplingParams(temperature=1.0, stop_token_ids=tok.stop_ids)
    turns_seen, lock = [], threading.Lock()

    def on_turn(partial, turn):
        with lock:
            turns_seen.append((partial.ids, turn.index))

    runs = []
    for episodes in (_episodes(2, 2), _episodes(2, 2)[::-1]):  # other order, other batch rows
        with GenerateSampler(tiny_model, sp, tok.pad_id, policy_version=4, batch_wait_s=0.05) as s:
            runs.append((_run_all(s, episodes, on_turn), list(s.batch_sizes)))
    return runs, turns_seen


@pytest.mark.slow
def test_real_model_concurrent_episodes_are_keyed_and_logprobs_match(tiny_model, generate_runs):
    ((forward, batched), (backward, _)), turns_seen = generate_runs
    assert max(batched) > 1  # concurrent episodes really shared generate calls
    by_ids = {t.ids: t for t in backward}
    assert len(forward) == len(by_ids) == 4
    assert len(turns_seen) == sum(len(t.turns) for t in forward + backward)
    forward_fn = jax.jit(lambda ids: jax.nn.log_softmax(tiny_model(ids), axis=-1))
    for traj in forward:
        assert len(traj.turns) >= 2 and len(traj.tokens) <= TINY_LIMITS.max_traj_tokens
        ref = by_ids[traj.ids]
        np.testing.assert_array_equal(traj.tokens, ref.tokens)  # keyed: order-independent
        np.testing.assert_allclose(traj.logprobs, ref.logprobs, atol=1e-5)
        assert traj.policy_versions == (4,) * len(traj.turns) and traj.reward in (0.0, 1.0)

        # Independent check: the sampled log-probs are the model's own next-token log-probs
        # (temperature 1, no nucleus) at the loss-masked positions of the trajectory.
        padded = np.zeros((1, TINY_LIMITS.max_traj_tokens), np.int32)
        padded[0, : len(traj.tokens)] = traj.tokens
        logp = np.asarray(forward_fn(padded))[0, : len(traj.tokens) - 1]
        picked = np.take_along_axis(logp, traj.tokens[1:, None], -1)[:, 0]
        mask = traj.loss_mask[1:]
        np.testing.assert_allclose(picked[mask], traj.logprobs[1:][mask], atol=2e-4)
    # Members of one prompt sample different turns: their keys differ.
    a, b = by_ids[EpisodeIds(0, 0, 0, 0)], by_ids[EpisodeIds(0, 0, 0, 1)]
    assert a.turns[0].tokens != b.turns[0].tokens


@pytest.mark.slow
def test_engine_sampler_matches_in_process_generate(tiny_model, generate_runs, tmp_path):
    """The same episodes through a real rollout server (embedded continuous-batching engine,
    ZeroMQ client) give the same trajectories as `sampling.generate`."""
    tok = tokenizer.ByteTokenizer()
    sp = sampling.SamplingParams(temperature=1.0, stop_token_ids=tok.stop_ids)
    engine = EmbeddedEngine(tiny_model, max_batch=4, max_seq_len=128, version=4)
    address = f"ipc://{tmp_path}/engine.sock"
    server = RolloutServer(engine, address)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    client = EngineClient(address, timeout_s=120)
    try:
        via_engine = _run_all(EngineSampler(client, sp), _episodes(2, 2))
    finally:
        client.shutdown(timeout_s=30)
        thread.join(timeout=30)
        client.close()
    ((reference, _), _), _ = generate_runs
    by_ids = {t.ids: t for t in reference}
    for traj in via_engine:
        np.testing.assert_array_equal(traj.tokens, by_ids[traj.ids].tokens)
        np.testing.assert_allclose(traj.logprobs, by_ids[traj.ids].logprobs, atol=1e-4)
        assert traj.policy_versions == (4,) * len(traj.turns)
