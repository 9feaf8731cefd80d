"""One optimizer step per batch; a non-finite gradient skips the update; checkpoints round-trip."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs import common
from thundersync_jax.learner.checkpoint import Checkpointer
from thundersync_jax.learner.train_state import (
    init_train_state,
    make_apply_update,
    make_optimizer,
)


def _optim(**kw):
    optim = common.get_base_config().optim  # every key at its default, then the test's values
    optim.update({"learning_rate": 0.1, **kw})
    return optim


def _params():
    return {"w": jnp.arange(15.0).reshape(3, 5) / 7, "b": jnp.ones((5,))}


def test_step_matches_optax_with_clipping():
    opt = make_optimizer(_optim(name="sgd", learning_rate=0.5, max_grad_norm=1.0))
    state = init_train_state(_params(), opt, seed=0)
    grads = {"w": jnp.full((3, 5), 2.0), "b": jnp.zeros((5,))}
    new, finite, norm = make_apply_update(opt)(state, grads)
    # global norm sqrt(15*4) > 1: clipped to unit norm, then sgd step of 0.5
    scale = 1.0 / np.sqrt(60.0)
    np.testing.assert_allclose(new.params["w"], _params()["w"] - 0.5 * 2.0 * scale, rtol=1e-6)
    assert bool(finite) and abs(float(norm) - np.sqrt(60.0)) < 1e-5
    assert int(new.step) == 1 and int(new.data_position) == 1


def test_nan_gradient_skips_update_but_advances_step():
    opt = make_optimizer(_optim())
    state = init_train_state(_params(), opt, seed=0)
    apply = make_apply_update(opt, donate=False)  # `state` is compared after the call
    state, _, _ = apply(state, jax.tree.map(jnp.ones_like, _params()))
    bad = {"w": jnp.full((3, 5), jnp.nan), "b": jnp.ones((5,))}
    new, finite, _ = apply(state, bad)
    assert not bool(finite)
    jax.tree.map(np.testing.assert_array_equal, new.params, state.params)
    jax.tree.map(np.testing.assert_array_equal, new.opt_state, state.opt_state)
    assert int(new.step) == 2


def test_zero_gradient_skips_update_only_when_asked():
    """Adam would keep moving on momentum after a zero gradient; skip_zero_grad stops that."""
    opt = make_optimizer(_optim())
    state = init_train_state(_params(), opt, seed=0)
    state, _, _ = make_apply_update(opt)(state, jax.tree.map(jnp.ones_like, _params()))
    zero = jax.tree.map(jnp.zeros_like, _params())

    moved, applied, norm = make_apply_update(opt, donate=False)(state, zero)
    assert bool(applied) and float(norm) == 0.0
    assert not np.allclose(moved.params["w"], state.params["w"])  # momentum alone moved it

    kept, applied, _ = make_apply_update(opt, skip_zero_grad=True, donate=False)(state, zero)
    assert not bool(applied)
    jax.tree.map(np.testing.assert_array_equal, kept.params, state.params)
    jax.tree.map(np.testing.assert_array_equal, kept.opt_state, state.opt_state)
    assert int(kept.step) == 2 and int(kept.data_position) == 2

    tiny = jax.tree.map(lambda x: jnp.full_like(x, 1e-30), _params())
    _, applied, _ = make_apply_update(opt, skip_zero_grad=True)(state, tiny)
    assert bool(applied)  # only an exactly-zero gradient is "no signal"


def test_invalid_optimizer_is_named():
    with pytest.raises(ValueError, match="optim.name='lion'"):
        make_optimizer(_optim(name="lion"))
    with pytest.raises(ValueError, match="learning_rate=0"):
        make_optimizer(_optim(learning_rate=0))


def test_checkpoint_round_trip_keeps_structure(tmp_path):
    opt = make_optimizer(_optim())
    state = init_train_state(_params(), opt, seed=3)
    state, _, _ = make_apply_update(opt)(state, jax.tree.map(jnp.ones_like, _params()))
    ck = Checkpointer(str(tmp_path), keep=2)
    assert ck.restore_latest(state) is None
    ck.save(state)
    fresh = init_train_state(_params(), opt, seed=3)
    restored = ck.restore_latest(fresh)
    assert jax.tree.structure(restored) == jax.tree.structure(state)
    jax.tree.map(np.testing.assert_array_equal, restored, state)
    # the restored optimizer state still drives optax
    optax.apply_updates(restored.params, restored.params)
    ck.close()


def test_corrupt_checkpoint_fails_clearly(tmp_path):
    opt = make_optimizer(_optim())
    state = init_train_state(_params(), opt, seed=0)
    ck = Checkpointer(str(tmp_path))
    ck.save(state)
    ck.close()
    step_dir = tmp_path / "checkpoints" / "0"
    for f in step_dir.rglob("*"):
        if f.is_file() and f.stat().st_size > 0 and "metadata" not in f.name:
            f.write_bytes(b"garbage")
    with pytest.raises(RuntimeError, match="could not be restored"):
        Checkpointer(str(tmp_path)).restore_latest(state)


def test_warmup_ramps_the_learning_rate_over_applied_updates():
    """SGD with warmup_steps=3: steps of lr/3, 2lr/3, lr, lr; a skipped step does not count."""
    opt = make_optimizer(_optim(name="sgd", learning_rate=0.3, max_grad_norm=0.0, warmup_steps=3))
    apply = make_apply_update(opt, skip_zero_grad=True)
    state = init_train_state({"w": jnp.zeros(())}, opt, seed=0)
    moves = []
    for g in (1.0, 0.0, 1.0, 1.0, 1.0):
        before = float(state.params["w"])
        state, _, _ = apply(state, {"w": jnp.asarray(g)})
        moves.append(before - float(state.params["w"]))
    np.testing.assert_allclose(moves, [0.1, 0.0, 0.2, 0.3, 0.3], rtol=1e-6)
    with pytest.raises(ValueError, match="warmup_steps=-1"):
        make_optimizer(_optim(warmup_steps=-1))


def test_cosine_decay_after_warmup_reaches_zero():
    """warmup 2, decay to update 6: lr/2, lr, then a cosine from lr down to 0, then 0."""
    from thundersync_jax.learner.train_state import learning_rate_schedule

    sched = learning_rate_schedule(1.0, warmup_steps=2, decay_steps=6)
    got = [float(sched(i)) for i in range(8)]
    cosine = [0.5 * (1 + np.cos(np.pi * k / 4)) for k in range(5)]
    np.testing.assert_allclose(got, [0.5, 1.0, *cosine, 0.0], atol=1e-6)
    with pytest.raises(ValueError, match="decay_steps=2"):
        learning_rate_schedule(1.0, warmup_steps=2, decay_steps=2)
