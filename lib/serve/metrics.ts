/**
 * GET /metrics in the Prometheus text format (prom-client's registry, counters, gauges and
 * histograms). Request and token counts and latencies are recorded as requests end; the
 * engine's own totals (passes, bytes read, expert cache, queue) are read at each scrape, so
 * they cost the serving path nothing.
 */
import { Counter, Gauge, Histogram, Registry } from "prom-client";
import type { GenerationResult } from "./generation.ts";
import type { Engine } from "./runner.ts";

/** Seconds: time to first token spans a queue wait and a prefill, from ms to minutes. */
const TTFT_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600];
/** Seconds between tokens: ms on the tiny model, up to minutes per pass at full size. */
const TOKEN_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];

/** The server's metrics: one registry per server (tests run several in one process). */
export class ServeMetrics {
  readonly registry = new Registry();
  readonly #requests: Counter<"api" | "status">;
  readonly #promptTokens: Counter<"api">;
  readonly #generatedTokens: Counter<"api">;
  readonly #reusedTokens: Counter<"api">;
  readonly #reuseHits: Counter<"api">;
  readonly #ttft: Histogram;
  readonly #tokenLatency: Histogram;
  readonly #drafted: Counter;
  readonly #accepted: Counter;
  readonly #finished: Counter<"api" | "reason">;

  constructor(readonly engine: Engine) {
    const registers = [this.registry];
    const counter = <L extends string>(name: string, help: string, labelNames: L[] = []) =>
      new Counter<L>({ name, help, labelNames, registers });
    this.#requests = counter(
      "k3_http_requests_total",
      "HTTP requests answered, by API route and status code",
      ["api", "status"],
    );
    this.#promptTokens = counter("k3_prompt_tokens_total", "Prompt tokens of generations", [
      "api",
    ]);
    this.#generatedTokens = counter("k3_generated_tokens_total", "Tokens generated", ["api"]);
    this.#reusedTokens = counter(
      "k3_prompt_reused_tokens_total",
      "Prompt tokens resumed from a retained sequence state instead of prefilled",
      ["api"],
    );
    this.#reuseHits = counter(
      "k3_retained_state_hits_total",
      "Generations that resumed a retained sequence state",
      ["api"],
    );
    this.#finished = counter(
      "k3_generations_total",
      "Generations (choices) ended, by how they ended",
      ["api", "reason"],
    );
    this.#drafted = counter(
      "k3_speculative_draft_tokens_total",
      "Draft tokens checked in verify passes",
    );
    this.#accepted = counter(
      "k3_speculative_accepted_tokens_total",
      "Draft tokens the model accepted",
    );
    this.#ttft = new Histogram({
      name: "k3_time_to_first_token_seconds",
      help: "Arrival of a request to its first token, queue wait included",
      buckets: TTFT_BUCKETS,
      registers,
    });
    this.#tokenLatency = new Histogram({
      name: "k3_time_per_output_token_seconds",
      help: "Time between output tokens after the first (one observation per token)",
      buckets: TOKEN_BUCKETS,
      registers,
    });
    this.#engineGauges();
  }

  get contentType(): string {
    return this.registry.contentType;
  }

  /** The text a scrape returns. */
  text(): Promise<string> {
    return this.registry.metrics();
  }

  /** One answered request; `api` is a known route (unknown paths are counted as "other"). */
  request(api: string, status: number): void {
    this.#requests.inc({ api, status: String(status) });
  }

  /** The choices of one finished generation (they share one prompt). */
  generation(api: string, results: GenerationResult[]): void {
    if (results.length === 0) return;
    const first = results[0];
    this.#promptTokens.inc({ api }, first.usage.prompt);
    this.#reusedTokens.inc({ api }, first.usage.cached);
    if (first.usage.cached > 0) this.#reuseHits.inc({ api });
    for (const r of results) {
      const t = r.timing;
      this.#generatedTokens.inc({ api }, r.usage.completion);
      this.#finished.inc({ api, reason: r.ended });
      this.#drafted.inc(r.speculation.drafted);
      this.#accepted.inc(r.speculation.accepted);
      if (t.completion_tokens > 0) this.#ttft.observe(t.ttft_ms / 1000);
      // The mean gap, once per token after the first: the histogram's count stays tokens.
      if (t.completion_tokens > 1 && t.tokens_per_second > 0) {
        const gap = 1 / t.tokens_per_second;
        for (let i = 1; i < t.completion_tokens; i++) this.#tokenLatency.observe(gap);
      }
    }
  }

  /** Gauges and totals read from the engine at each scrape. */
  #engineGauges(): void {
    const registers = [this.registry];
    const session = this.engine.session;
    const gauge = (name: string, help: string, read: () => number | undefined) =>
      new Gauge({
        name,
        help,
        registers,
        collect() {
          const v = read();
          if (v !== undefined) this.set(v);
        },
      });
    // Totals kept by the engine are exposed as counters set to the engine's count.
    const total = (name: string, help: string, read: () => number | undefined) =>
      new Counter({
        name,
        help,
        registers,
        collect() {
          const v = read();
          if (v === undefined) return;
          this.reset();
          this.inc(v);
        },
      });
    const passes = () => session.batcher?.stats;
    const io = () => session.model?.stream?.pool.totals();
    const cache = () => session.model?.stream?.cache?.stats;
    gauge("k3_queue_depth", "Requests waiting for a free sequence", () => session.queueDepth);
    gauge("k3_running_sequences", "Sequences generating now", () => session.batchSize);
    total("k3_passes_total", "Forward passes run", () => passes()?.passes);
    total(
      "k3_pass_sequences_total",
      "Sequences over all forward passes (divide by k3_passes_total: sequences per pass)",
      () => passes()?.sequences,
    );
    gauge(
      "k3_pass_sequences_max",
      "Most sequences in one forward pass",
      () => passes()?.maxSequences,
    );
    gauge(
      "k3_last_pass_sequences",
      "Sequences in the last forward pass",
      () => passes()?.last?.sequences,
    );
    total("k3_pass_seconds_total", "Seconds inside forward passes", () => passes()?.seconds);
    total("k3_trunk_bytes_read_total", "Trunk weight bytes read from disk", () => io()?.trunkBytes);
    total(
      "k3_expert_bytes_read_total",
      "Expert weight bytes read from disk",
      () => io()?.expertBytes,
    );
    total(
      "k3_expert_cache_requests_total",
      "Expert lookups in the expert cache",
      () => cache()?.requests,
    );
    total("k3_expert_cache_hits_total", "Expert lookups the cache held", () => cache()?.hits);
    total("k3_expert_cache_misses_total", "Expert lookups read from disk", () => cache()?.misses);
    gauge("k3_expert_cache_hit_ratio", "Expert cache hits over lookups so far", () => {
      const c = cache();
      return c && c.requests > 0 ? c.hits / c.requests : undefined;
    });
  }
}
