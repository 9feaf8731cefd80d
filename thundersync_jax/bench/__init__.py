"""Benchmarks that run real work (DESIGN §4), above the training loop's layers.

gpu_check  the one GPU check: learner tokens/s + MFU, vLLM tokens/s, publication, stream vs
           sync with vLLM (`experiments.gpu_check`, `--cpu` for the tiny tested run)
"""
