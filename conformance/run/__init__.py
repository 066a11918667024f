"""The framework-neutral half of a training run, shared by both trainers: one concept a module.

session     the output directory, data, checkpoint to resume and metrics log of a run (open_run)
loop        the run's decisions, once for both trainers: opening with every rank agreeing, best
            validation loss, the checkpoint or stop after an update
counters    updates done, schedule position, skips (saved in every checkpoint)
resume      which checkpoint a run may continue from, and which config changes it allows
records     metrics lines, evaluation totals, when to evaluate and save, the checkpoint's JSON half
batches     facts about a window before the forward pass (valid counts, injected overflows)
throughput  tokens/s and MFU
metrics     metrics.jsonl, progress display, TensorBoard
compare     `twinstep compare`: two runs update by update
events      named moments of a run an observer may watch (progress, profiling, fault tests)
"""
