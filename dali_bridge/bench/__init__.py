"""``dali-bridge bench``: the bridge's loaders against hand-written baselines and the decode ceiling.

Every *candidate* — a bridge backend, a hand-written baseline, or the decode-only ceiling — runs
at each thread/worker count in a fresh Python process, so threads, worker processes, allocator
state and memory never carry over from one candidate to the next. Inside that process the
candidate yields one continuous stream of batches (epoch after epoch, in the bridge's sample
order): the first batch is timed from construction (``first_batch_s``), ``warmup`` batches are
discarded, then ``repeat`` windows of ``batches`` batches are timed. Per window: images/s,
megapixels/s of decoded input (sum of the source images' pixel counts, read once from their
headers) and CPU seconds of the whole process tree (the process, its threads and its worker
processes, from ``/proc``). Peak RSS of the process tree (workers included) is sampled from the
parent every 50 ms; PSS (shared pages split between processes) is read by the candidate itself
after the warm-up and after the timed windows, never inside them (reading it costs tens of ms).
``model_ms`` adds one window in which the consumer sleeps that long after each batch (a
simulated model step) and measures how long it waits for data.

The package, by concern: ``results`` (what is recorded: candidates, their rows, the machine,
the JSON), ``procstats`` (CPU and memory of a process tree), ``baselines`` (the hand-written
loaders and the decode ceiling; ``spdl_baseline``: the SPDL thread-pool one), ``measure`` (the
measuring process), ``runner`` (the parent that starts and monitors them), ``report`` (the
printed table, stability warnings, the markdown of ``benchmarks/README.md``: ``python -m
dali_bridge.bench readme``) and ``plot`` (the PNG).
"""
from __future__ import annotations
