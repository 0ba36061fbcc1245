"""How an engine's host loop meets the GPU's iterations: in series, or overlapped.

Without overlap (vLLM <= 0.12 by default: `EngineCore.step` schedules, launches, blocks
on the result, then processes it) the GPU waits for the host between iterations, so an
iteration costs the GPU time plus the host time (the calibrated overheads).

With overlap scheduling the host prepares iteration i+1 while the GPU runs iteration i:
* SGLang's `event_loop_overlap` (default on): receive requests, form batch i+1, launch it
  (its input tokens are resolved on the GPU from batch i's sampled ids, no sync), then
  process batch i's results (wait for them, update the requests, stream the tokens).
* TRT-LLM's PyExecutor `_executor_loop_overlap` (default on): schedule and launch step
  i+1, update the requests from step i's samples, launch step i+1's sampling, then
  process step i's responses (its docs: "CPU work (step n) and GPU computation (step n+1)
  run concurrently").
* vLLM's async scheduling (`--async-scheduling`, opt-in up to 0.12): schedule and launch
  i+1 before processing i's output.
Each loop waits only for the iteration before the one on the GPU, so in a steady state
the host loop and the GPU stream each run back to back at their own pace and an iteration
lasts the longer of the two: max(GPU, host loop), not their sum.

Which host work that covers is not in the calibrated overheads' name: fitted as a sum
they also carry GPU time per iteration and per sequence (sampling and metadata kernels,
CUDA-graph padding), and spread over the rows of TRT-LLM and of SGLang's DeepSeek they
add to the GPU time at every batch size (the step and per-sequence overheads taken as the
overlapped host loop fit the rows worse: training objective 1.38-1.67 against 1.17-1.19
in series). So the overheads stay in series, on the critical path, and the loop's work
per running request (`BackendCalibration.host_seq_overhead_s`: its output processed, its
token streamed, its next input formed) is the host loop that runs beside the GPU: an
iteration of n requests lasts at least n times it. That floor is what SGLang's
Llama-3.1-8B rows at 512 clients show: 23-34 ms a token at TP 1 to 8, whatever the GPU
time (5-11 ms).
"""

from __future__ import annotations


def overlapped_step_s(step_s: float, host_loop_s: float) -> float:
    """One iteration of an engine whose host loop runs beside the GPU: the longer of the
    iteration in series (`step_s`) and the loop (`host_loop_s`)."""
    return step_s if step_s > host_loop_s else host_loop_s
