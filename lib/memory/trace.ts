/**
 * Expert-request traces: what `--dump-cache-trace DIR` writes and `k3 sim-cache` replays.
 * DIR/expert_trace.jsonl: a header line, then one line per (step, layer) request:
 *   {"format":"k3-expert-trace","version":1,"layers":L,"experts":E,"expert_bytes":B}
 *   {"step":0,"layer":1,"ids":[3,7,9]}
 */
import * as path from "node:path";
import { writeFileAtomic } from "../io/atomic.ts";
import { readUserText } from "../io/files.ts";
import { badInput } from "../errors.ts";
import type { ExpertSource, ReadyExpert } from "./sources.ts";

const TRACE_FILE = "expert_trace.jsonl";

interface TraceHeader {
  format: "k3-expert-trace";
  version: 1;
  layers: number;
  experts: number;
  expert_bytes: number;
}

interface TraceRecord {
  step: number;
  layer: number;
  ids: number[];
}

export interface Trace {
  header: TraceHeader;
  records: TraceRecord[];
}

/** An expert source that records every request before passing it on. */
export class TracedExperts implements ExpertSource {
  readonly records: TraceRecord[] = [];
  /** The generation step requests are filed under; the caller advances it. */
  step = 0;

  constructor(readonly inner: ExpertSource) {}

  fetch(layer: number, ids: number[]): AsyncIterable<ReadyExpert> {
    this.records.push({ step: this.step, layer, ids: [...ids] });
    return this.inner.fetch(layer, ids);
  }
  release(layer: number): void {
    this.inner.release(layer);
  }
  close(): void {
    this.inner.close();
  }
}

/** Writes `records` to DIR/expert_trace.jsonl (atomically); returns the file. */
export async function writeTrace(
  dir: string,
  header: Omit<TraceHeader, "format" | "version">,
  records: TraceRecord[],
): Promise<string> {
  await Deno.mkdir(dir, { recursive: true });
  const file = path.join(dir, TRACE_FILE);
  const head: TraceHeader = { format: "k3-expert-trace", version: 1, ...header };
  const lines = [JSON.stringify(head), ...records.map((r) => JSON.stringify(r))];
  await writeFileAtomic(file, lines.join("\n") + "\n");
  return file;
}

/** A trace is about 100 bytes per expert request: millions of them, under V8's string limit. */
const MAX_TRACE_BYTES = 256 << 20;

/** Reads a trace file (or DIR holding expert_trace.jsonl). */
export async function readTrace(where: string): Promise<Trace> {
  const file = (await Deno.stat(where).catch(() => null))?.isDirectory
    ? path.join(where, TRACE_FILE)
    : where;
  // A FIFO or /dev/zero is refused before it is read.
  const text = (await readUserText(file, "cache trace", { limit: MAX_TRACE_BYTES }))!;
  const lines = text.split("\n").filter((l) => l.trim() !== "");
  const parse = (l: string, n: number) => {
    try {
      return JSON.parse(l);
    } catch {
      throw badInput(`${file}: line ${n + 1} is not JSON`);
    }
  };
  const header = parse(lines[0] ?? "", 0) as TraceHeader;
  if (header?.format !== "k3-expert-trace" || header.version !== 1) {
    throw badInput(`${file}: line 1 is not a k3-expert-trace version 1 header`);
  }
  for (const k of ["layers", "experts", "expert_bytes"] as const) {
    if (!Number.isInteger(header[k]) || header[k] < 0) {
      throw badInput(`${file}: header field "${k}" must be a non-negative integer`);
    }
  }
  const records = lines.slice(1).map((l, i) => {
    const r = parse(l, i + 1) as TraceRecord;
    const ok = Number.isInteger(r.step) && Number.isInteger(r.layer) && Array.isArray(r.ids) &&
      r.ids.every((id) => Number.isInteger(id) && id >= 0 && id < header.experts);
    if (!ok) {
      throw badInput(`${file}: line ${i + 2} needs integer "step", "layer" and "ids" < experts`);
    }
    return r;
  });
  return { header, records };
}
