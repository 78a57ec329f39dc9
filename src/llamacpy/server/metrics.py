"""``GET /metrics``: Prometheus text with llama-server's ``llamacpp:*`` series, plus the
wait queue, rejected requests and KV-cache usage, and per-request histograms (time to first
token, inter-token latency, end-to-end latency, queue wait, prompt and generated tokens),
KV-cache bytes, busy slots, aborted requests and prompt-cache hits (the series beyond
llama-server's carry a ``model`` label)."""

from __future__ import annotations

from typing import Any

HISTOGRAMS = (
    ("ttft", "time_to_first_token_seconds", "Time from a request's arrival to its first token."),
    ("inter_token", "inter_token_latency_seconds", "Time between a request's tokens."),
    ("e2e", "e2e_request_latency_seconds", "Time from a request's arrival to its end."),
    ("queue", "request_queue_time_seconds", "Time a request waited for a slot."),
    ("prompt_tokens", "request_prompt_tokens", "Prompt tokens of a request."),
    ("generated_tokens", "request_generation_tokens", "Tokens a request generated."),
)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def request_series(scheduler: Any, ctx: Any, model: str) -> list[str]:
    """The per-request histograms, gauges and counters, labelled with the model."""
    st, label = scheduler.stats, f'model="{_escape(model)}"'
    lines: list[str] = []
    for attr, name, help_ in HISTOGRAMS:
        h = getattr(st, attr)
        lines += [f"# HELP llamacpp:{name} {help_}", f"# TYPE llamacpp:{name} histogram"]
        lines += [f'llamacpp:{name}_bucket{{{label},le="{le}"}} {n}' for le, n in h.cumulative()]
        lines += [f"llamacpp:{name}_sum{{{label}}} {h.sum:.6g}",
                  f"llamacpp:{name}_count{{{label}}} {h.count}"]  # fmt: skip
    kv = ctx.kv
    used_bytes = int(kv.nbytes * kv.n_used / ctx.n_ctx) if ctx.n_ctx else 0
    busy = sum(1 for s in scheduler.slots if s.busy)
    for kind, name, help_, value in (
        ("gauge", "kv_cache_used_bytes", "Bytes of the KV cache holding tokens.", used_bytes),
        ("gauge", "kv_cache_size_bytes", "Bytes of the KV cache.", int(kv.nbytes)),
        ("gauge", "slots_busy", "Slots working on a request.", busy),
        ("gauge", "slots_total", "Slots of the model.", len(scheduler.slots)),
        ("counter", "requests_aborted_total", "Requests aborted (client gone, timeout).",
         st.n_aborted),
        ("counter", "prompt_cache_hits_total", "Requests that reused a cached prompt prefix.",
         st.n_cache_hits),
        ("counter", "prompt_cache_hit_tokens_total", "Prompt tokens reused from the cache.",
         st.n_cache_hit_tokens),
    ):  # fmt: skip
        lines += [f"# HELP llamacpp:{name} {help_}", f"# TYPE llamacpp:{name} {kind}",
                  f"llamacpp:{name}{{{label}}} {value}"]  # fmt: skip
    return lines


def render(scheduler: Any, ctx: Any, model: str = "") -> str:
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
        ("counter", "prompt_cache_reuse_tokens_total",
         "Prompt tokens reused from cached chunks moved into place (--cache-reuse).",
         c.n_cache_shifted),
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
    lines += request_series(scheduler, ctx, model)
    return "\n".join(lines) + "\n"
