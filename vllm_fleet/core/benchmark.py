"""vLLM's own benchmark (`vllm bench serve`): its settings, its report parsed, and the batch-size sweep.

Pure: roles/bench.py runs the commands on the hosts. The report is read, not the exit code: `vllm
bench
serve` exits 0 even when every request failed (a missing key gives 16 x 401 and rc 0), so a result
counts only with successful requests and no failed ones.

The sweep follows the user's first seed document: max-num-batched-tokens from max-model-len upward
(x1, x2, x3 ...) until out of memory or preemption warnings, and with chunked prefill from 128 upward.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from vllm_fleet.core.tables import columns

BLOCK_START = "Serving Benchmark Result"
# report label -> field; the labels are vLLM 0.32's (vllm/benchmarks/serve.py)
FIELDS = {
    "Successful requests": "successful",
    "Failed requests": "failed",
    "Benchmark duration (s)": "duration_s",
    "Request throughput (req/s)": "request_throughput",
    "Output token throughput (tok/s)": "output_throughput",
    "Total token throughput (tok/s)": "total_throughput",
    "Mean TTFT (ms)": "mean_ttft_ms",
    "Median TTFT (ms)": "median_ttft_ms",
    "P99 TTFT (ms)": "p99_ttft_ms",
    "Mean TPOT (ms)": "mean_tpot_ms",
    "Mean ITL (ms)": "mean_itl_ms",
    "P99 ITL (ms)": "p99_itl_ms",
}
_LINE = re.compile(r"^\s*([^:=-][^:]*?):\s+(-?\d+(?:\.\d+)?)\s*$")


class BenchError(ValueError):
    """No report in the output, or one that says the run did not measure anything."""


@dataclass(frozen=True)
class BenchResult:
    successful: int
    failed: int
    duration_s: float
    request_throughput: float
    output_throughput: float
    total_throughput: float
    mean_ttft_ms: float
    median_ttft_ms: float
    p99_ttft_ms: float
    mean_tpot_ms: float
    mean_itl_ms: float
    p99_itl_ms: float
    # every "label: number" line of the report, also those not named above
    raw: Mapping[str, float] = field(default_factory=dict, compare=False)

    @property
    def ok(self) -> bool:
        return self.successful > 0 and self.failed == 0


def parse(output: str) -> BenchResult:
    """The last report block in `vllm bench serve` output (progress bars and logs around it ignored)."""
    start = output.rfind(BLOCK_START)
    if start < 0:
        tail = "\n".join(output.strip().splitlines()[-5:])
        raise BenchError(f"no '{BLOCK_START}' block in the benchmark output; it ended with:\n{tail}")
    raw: dict[str, float] = {}
    for line in output[start:].splitlines()[1:]:
        if line.startswith("=" * 10):
            break
        m = _LINE.match(line)
        if m:
            raw[m.group(1).strip()] = float(m.group(2))
    missing = [label for label in FIELDS if label not in raw]
    if missing:
        raise BenchError(f"benchmark report lacks {', '.join(missing)}")
    values = {name: raw[label] for label, name in FIELDS.items()}
    successful, failed = int(values.pop("successful")), int(values.pop("failed"))
    return BenchResult(successful=successful, failed=failed, **values, raw=raw)


@dataclass(frozen=True)
class BenchSettings:
    """Small by default: a CPU host serves the tiny model, and the sweep runs one bench per trial."""

    input_len: int = 32
    output_len: int = 16
    num_prompts: int = 16
    sweep_multiples: int = 3  # max-model-len x1 .. xN
    sweep_chunked: int = 0  # chunked-prefill trials: 128, 256, ... (below max-model-len)
    trial_port: int = 18000  # transient trial servers listen here on 127.0.0.1, one at a time


ENV = {
    "input_len": "VLLM_FLEET_BENCH_INPUT_LEN",
    "output_len": "VLLM_FLEET_BENCH_OUTPUT_LEN",
    "num_prompts": "VLLM_FLEET_BENCH_NUM_PROMPTS",
    "sweep_multiples": "VLLM_FLEET_BENCH_SWEEP_MULTIPLES",
    "sweep_chunked": "VLLM_FLEET_BENCH_SWEEP_CHUNKED",
    "trial_port": "VLLM_FLEET_BENCH_TRIAL_PORT",
}


def settings(data: Mapping[str, object] | None, environ: Mapping[str, str]) -> BenchSettings:
    """Host data `vllm_bench` over the defaults, the controller's environment over both."""
    values: dict[str, int] = {}
    for name, var in ENV.items():
        raw = environ.get(var, (data or {}).get(name))
        if raw is None or raw == "":
            continue
        try:
            values[name] = int(raw)  # type: ignore[call-overload]
        except (TypeError, ValueError):
            raise BenchError(f"{var} / vllm_bench.{name}: {raw!r} is not an integer") from None
        if values[name] < (0 if name.startswith("sweep") else 1):
            raise BenchError(f"{var} / vllm_bench.{name}: {raw!r} is too small")
    unknown = set(data or {}) - set(ENV)
    if unknown:
        raise BenchError(f"vllm_bench: unknown keys {', '.join(sorted(unknown))} (known: {', '.join(ENV)})")
    return BenchSettings(**values)


def bench_args(s: BenchSettings, base_url: str, served_name: str, tokenizer: str) -> list[str]:
    """`vllm bench serve` arguments; the key is never one of them (it reads OPENAI_API_KEY)."""
    return ["bench", "serve", "--backend", "openai", "--base-url", base_url, "--model", served_name,
            "--tokenizer", tokenizer, *dataset_args(s.input_len, s.output_len, s.num_prompts)]


def dataset_args(input_len: int, output_len: int, num_prompts: int) -> list[str]:
    """The prompts' part, shared with `vllm-fleet tune` (core/tune.py): random tokens of fixed lengths,
    seed 0, so two runs (and two settings) see the same requests."""
    return ["--dataset-name", "random", "--random-input-len", str(input_len), "--random-output-len",
            str(output_len), "--num-prompts", str(num_prompts), "--seed", "0"]


@dataclass(frozen=True)
class Trial:
    max_num_batched_tokens: int
    chunked_prefill: bool = False

    def flags(self) -> list[str]:
        out = ["--max-num-batched-tokens", str(self.max_num_batched_tokens)]
        return out + (["--enable-chunked-prefill"] if self.chunked_prefill else [])

    def inventory(self) -> dict[str, object]:
        """The `flags` entries an operator adds to the host's inventory to keep this setting."""
        out: dict[str, object] = {"max_num_batched_tokens": self.max_num_batched_tokens}
        if self.chunked_prefill:
            out["enable_chunked_prefill"] = True
        return out

    @property
    def label(self) -> str:
        return f"{self.max_num_batched_tokens}" + (" +chunked" if self.chunked_prefill else "")


def sweep(max_model_len: int, multiples: int = 3, chunked: int = 0, chunked_start: int = 128) -> list[Trial]:
    """max-model-len x1, x2 ... xN; then chunked prefill from `chunked_start`, doubling, below
    max-model-len (at or above it, the plain series already covers the budget)."""
    if max_model_len < 1:
        raise ValueError("max_model_len must be positive")
    trials = [Trial(max_model_len * k) for k in range(1, multiples + 1)]
    value = chunked_start
    while len(trials) < multiples + chunked and value < max_model_len:
        trials.append(Trial(value, chunked_prefill=True))
        value *= 2
    return trials


@dataclass(frozen=True)
class TrialOutcome:
    trial: Trial
    result: BenchResult | None
    preemptions: int | None = None  # None: the server exposed no counter
    error: str = ""

    @property
    def usable(self) -> bool:
        """The seed's stopping rule: a setting that preempts (or fails) is past the useful range."""
        return self.result is not None and self.result.ok and not self.preemptions

    @property
    def note(self) -> str:
        if self.error:
            return self.error
        if self.result is None or not self.result.ok:
            return "requests failed"
        if self.preemptions is None:
            return "ok (no preemption counter)"
        return f"{self.preemptions} preemptions" + ("" if self.preemptions else ", ok")


def best(outcomes: Sequence[TrialOutcome]) -> TrialOutcome | None:
    """Highest output token throughput among usable trials; a tie goes to the lower mean ITL."""
    usable = [o for o in outcomes if o.usable]
    if not usable:
        return None
    return max(usable, key=lambda o: (o.result.output_throughput, -o.result.mean_itl_ms))  # type: ignore[union-attr]


def preemptions(metrics: str) -> int | None:
    """vLLM's preemption counter from Prometheus text (/metrics is open, no key); None when absent.

    The counter is what the seed's "preemption warning" looks like in V1: the scheduler counts them."""
    total, seen = 0.0, False
    for line in metrics.splitlines():
        if line.startswith("vllm:num_preemptions") and not line.startswith("vllm:num_preemptions_created"):
            try:
                total += float(line.rsplit(" ", 1)[1])
                seen = True
            except (IndexError, ValueError):
                continue
    return int(total) if seen else None


HEAD = ("HOST", "INSTANCE", "SETTING", "OK/FAIL", "REQ/S", "OUT TOK/S", "TTFT MEAN", "TTFT P99", "ITL MEAN",
        "TPOT MEAN", "NOTE")


def row(host: str, instance: str, setting: str, r: BenchResult | None, note: str = "") -> tuple[str, ...]:
    if r is None:
        return (host, instance, setting, "-", "-", "-", "-", "-", "-", "-", note)
    return (host, instance, setting, f"{r.successful}/{r.failed}", f"{r.request_throughput:.2f}",
            f"{r.output_throughput:.1f}", f"{r.mean_ttft_ms:.1f} ms", f"{r.p99_ttft_ms:.1f} ms",
            f"{r.mean_itl_ms:.2f} ms", f"{r.mean_tpot_ms:.2f} ms", note or ("ok" if r.ok else "FAILED"))


def table(rows: Sequence[tuple[str, ...]]) -> str:
    return columns(HEAD, rows)
