/**
 * `make bench-download`: `k3 download` throughput over loopback from the stand-in Hub
 * (tests/hub_standin.ts) on one file of a few hundred MB, with 1 and with 8 connections,
 * against a plain single fetch of the same bytes (the ceiling of this machine's loopback and
 * Deno's HTTP stack). Medians of 3, with the load average. Synthetic bytes, loopback only:
 * a real line to the Hub is slower; this measures what k3 adds on top of the wire.
 *
 *   deno run -A bench/download.ts [BUILD_DIR] [--mb N]
 */
import * as os from "node:os";
import * as path from "node:path";
import { StandInHub } from "../tests/hub_standin.ts";

const args = Deno.args.filter((a) => !a.startsWith("--"));
const mbFlag = Deno.args.indexOf("--mb");
const MB = mbFlag >= 0 ? Number(Deno.args[mbFlag + 1]) : 400;
const root = path.resolve(args[0] ?? "build/bench-download");
const repo = path.resolve(import.meta.dirname!, "..");
const src = path.join(root, "src");
Deno.mkdirSync(src, { recursive: true });
const file = path.join(src, "model-00001-of-00001.safetensors");
const want = MB * 1e6;
if (
  (() => {
    try {
      return Deno.statSync(file).size !== want;
    } catch {
      return true;
    }
  })()
) {
  // Incompressible-looking bytes, written once (xorshift, 1 MB at a time).
  const out = Deno.openSync(file, { write: true, create: true, truncate: true });
  const buf = new Uint32Array(250_000);
  let x = 2463534242;
  for (let done = 0; done < want; done += 1e6) {
    for (let i = 0; i < buf.length; i++) {
      x ^= x << 13, x ^= x >>> 17, x ^= x << 5;
      buf[i] = x >>> 0;
    }
    out.writeSync(new Uint8Array(buf.buffer));
  }
  out.close();
}

const hub = StandInHub.start({ repo: "bench/model", source: src });
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const load = () => os.loadavg().map((l) => l.toFixed(2)).join(" ");

async function plainFetch(): Promise<number> {
  const f = hub.files[0];
  const t = performance.now();
  const res = await fetch(`${hub.storageOrigin}/blobs/${f.sha256}?expires=${Date.now() + 1e6}`);
  let n = 0;
  for await (const c of res.body!) n += c.length;
  if (n !== f.size) throw new Error(`short plain fetch: ${n}`);
  return n / ((performance.now() - t) / 1000);
}

async function download(connections: number): Promise<number> {
  const dir = path.join(root, `dl-${connections}`);
  await Deno.remove(dir, { recursive: true }).catch(() => {});
  const t = performance.now();
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      "--quiet",
      "--config",
      path.join(repo, "deno.json"),
      path.join(repo, "main.ts"),
      "download",
      "bench/model",
      dir,
      "--connections",
      String(connections),
    ],
    env: { HF_ENDPOINT: hub.endpoint, HF_TOKEN: "", HF_TOKEN_PATH: path.join(root, "none") },
  }).output();
  const secs = (performance.now() - t) / 1000;
  if (out.code !== 0) throw new Error(new TextDecoder().decode(out.stderr));
  await Deno.remove(dir, { recursive: true });
  return want / secs;
}

try {
  console.log(`bench-download: ${MB} MB over loopback, load average ${load()}`);
  const rows: [string, number][] = [];
  const plain = median([await plainFetch(), await plainFetch(), await plainFetch()]);
  rows.push(["plain fetch, 1 connection, no disk, no hash", plain]);
  for (const c of [1, 8]) {
    const runs = [await download(c), await download(c), await download(c)];
    rows.push([`k3 download --connections ${c} (disk + SHA-256 + rename)`, median(runs)]);
  }
  for (const [name, rate] of rows) {
    console.log(
      `  ${name.padEnd(56)} ${(rate / 1e9).toFixed(3)} GB/s  ${(100 * rate / plain).toFixed(0)}%`,
    );
  }
  console.log(
    `  (wall clock includes process start and the API calls; load average now ${load()})`,
  );
} finally {
  await hub.close();
}
