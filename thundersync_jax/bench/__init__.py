"""Benchmarks that run real work (DESIGN §4), above the training loop's layers.

  schedules  a recorded or synthetic trace replayed onto the real learner, every schedule,
             against the trace-driven model's prediction (`experiments.bench_schedules`)
  chunks     score-gradient chunk cost per shape (`experiments.bench_chunks`)
  attention_tiles  blockwise attention per tile size (`experiments.bench_attention`)
  publish    weight publication: snapshot write, engine load (`experiments.bench_publish`)
  gpu_check  the one GPU check: learner tokens/s + MFU, vLLM tokens/s, publication, stream vs
             sync with vLLM (`experiments.gpu_check`, `--cpu` for the tiny tested run)

`thundersync_jax.sim` stays the pure trace-driven model (no JAX learner inside).
"""
