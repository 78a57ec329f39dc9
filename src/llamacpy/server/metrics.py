"""``GET /metrics``: Prometheus text with llama-server's ``llamacpp:*`` series, plus the
wait queue, rejected requests and KV-cache usage."""

from __future__ import annotations

from typing import Any


def render(scheduler: Any, ctx: Any) -> str:
    c = scheduler.counters
    kv_used = int(ctx.kv.n_used)
    series = [
        ("counter", "prompt_tokens_total", "Number of prompt tokens processed.", c.n_prompt_tokens),
        ("counter", "prompt_seconds_total", "Prompt process time", c.t_prompt),
        ("counter", "tokens_predicted_total", "Number of generation tokens processed.",
         c.n_tokens_predicted),
        ("counter", "tokens_predicted_seconds_total", "Predict process time", c.t_predicted),
        ("counter", "n_decode_total", "Total number of llama_decode() calls", c.n_decode),
        ("counter", "n_tokens_max", "Largest observed n_tokens.", c.n_tokens_max),
        ("counter", "n_busy_slots_per_decode",
         "Average number of busy slots per llama_decode() call",
         c.n_busy_slots / max(c.n_decode, 1)),
        ("counter", "requests_rejected_total", "Requests answered 429 (queue full).",
         c.n_rejected),
        ("counter", "spec_decode_num_draft_tokens_total",
         "Speculative: Total draft tokens generated", c.n_draft_tokens),
        ("counter", "spec_decode_num_accepted_tokens_total",
         "Speculative: Total draft tokens accepted by the target model", c.n_draft_accepted),
        ("counter", "spec_decode_num_drafts_total",
         "Speculative: Total speculative decoding verification steps", c.n_draft_steps),
        ("gauge", "prompt_tokens_seconds", "Average prompt throughput in tokens/s.",
         c.n_prompt_tokens / c.t_prompt if c.t_prompt else 0.0),
        ("gauge", "predicted_tokens_seconds", "Average generation throughput in tokens/s.",
         c.n_tokens_predicted / c.t_predicted if c.t_predicted else 0.0),
        ("gauge", "requests_processing", "Number of requests processing.",
         scheduler.n_processing),
        ("gauge", "requests_deferred", "Number of requests deferred (waiting in the queue).",
         scheduler.n_queued),
        ("gauge", "queue_capacity", "Most requests that may wait for a slot.",
         scheduler.max_queue),
        ("gauge", "kv_cache_usage_ratio", "KV-cache usage. 1 means 100 percent usage.",
         kv_used / ctx.n_ctx),
        ("gauge", "kv_cache_tokens", "KV-cache tokens.", kv_used),
    ]  # fmt: skip
    lines = []
    for kind, name, help_, value in series:
        lines += [f"# HELP llamacpp:{name} {help_}", f"# TYPE llamacpp:{name} {kind}",
                  f"llamacpp:{name} {value:.6g}" if isinstance(value, float)
                  else f"llamacpp:{name} {value}"]  # fmt: skip
    return "\n".join(lines) + "\n"
