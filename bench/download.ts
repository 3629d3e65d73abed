/**
 * `make bench-download`: `k3 download` throughput over loopback from the stand-in Hub
 * (tests/support/hub_standin.ts) on one file of a few hundred MB, with 1 and with 8 connections,
 * against a plain single fetch of the same bytes (the ceiling of this machine's loopback and
 * Deno's HTTP stack) and against the disk's write + fsync rate. Then the SHA-256 rate of
 * libk3 (SHA-NI and portable) as a download and verify call it, against `openssl speed` on
 * this CPU. Medians of 3, with the load average. Synthetic bytes, loopback only: a real line
 * to the Hub is slower; this measures what k3 adds on top of the wire. No OpenMP anywhere
 * here (OMP_NUM_THREADS has no effect): SHA-256 runs one block stream per FFI call.
 *
 *   deno run -A bench/download.ts [BUILD_DIR] [--mb N]
 */
import * as os from "node:os";
import * as path from "node:path";
import { createHash } from "node:crypto";
import { Sha256, sha256Impl } from "../lib/hub/sha256.ts";
import { StandInHub } from "../tests/support/hub_standin.ts";

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

/** Writes the file's size in 8 MiB pieces to a new file and fsyncs it: the disk's rate. */
async function diskWrite(): Promise<number> {
  const out = path.join(root, "disk-probe");
  const buf = new Uint8Array(8 << 20).fill(7);
  const t = performance.now();
  const f = await Deno.open(out, { write: true, create: true, truncate: true });
  for (let done = 0; done < want; done += buf.length) {
    let at = 0;
    const n = Math.min(buf.length, want - done);
    while (at < n) at += await f.write(buf.subarray(at, n));
  }
  await f.syncData();
  f.close();
  const rate = want / ((performance.now() - t) / 1000);
  await Deno.remove(out);
  return rate;
}

/** SHA-256 of `data` in 8 MiB calls, as download and verify hash (libk3, or node:crypto). */
async function shaRate(data: Uint8Array, impl: "libk3" | "node"): Promise<number> {
  const t = performance.now();
  if (impl === "libk3") {
    const h = Sha256.fresh();
    for (let at = 0; at < data.length; at += 8 << 20) {
      await h.update(data.subarray(at, Math.min(data.length, at + (8 << 20))));
    }
    h.digest();
  } else {
    const h = createHash("sha256");
    for (let at = 0; at < data.length; at += 8 << 20) {
      h.update(data.subarray(at, Math.min(data.length, at + (8 << 20))));
    }
    h.digest("hex");
  }
  return data.length / ((performance.now() - t) / 1000);
}

/** `openssl speed -evp sha256` on 8 MiB blocks (bytes/s), or undefined without openssl. */
async function opensslRate(): Promise<number | undefined> {
  try {
    const out = await new Deno.Command("openssl", {
      args: ["speed", "-mr", "-evp", "sha256", "-bytes", String(8 << 20), "-seconds", "2"],
      stdout: "piped",
      stderr: "null",
    }).output();
    const m = new TextDecoder().decode(out.stdout).match(/^\+F:\d+:sha256:([\d.]+)/m);
    return m ? Number(m[1]) : undefined;
  } catch {
    return undefined;
  }
}

const gb = (rate: number) => `${(rate / 1e9).toFixed(3)} GB/s`;

try {
  console.log(`bench-download: ${MB} MB over loopback, load average ${load()}`);
  const rows: [string, number][] = [];
  const plain = median([await plainFetch(), await plainFetch(), await plainFetch()]);
  rows.push(["plain fetch, 1 connection, no disk, no hash", plain]);
  const disk = median([await diskWrite(), await diskWrite(), await diskWrite()]);
  for (const c of [1, 8]) {
    const runs = [await download(c), await download(c), await download(c)];
    rows.push([`k3 download --connections ${c} (disk + SHA-256 + rename)`, median(runs)]);
  }
  console.log(`  ${"".padEnd(56)} ${"rate".padStart(11)}  vs plain  vs disk`);
  for (const [name, rate] of rows) {
    console.log(
      `  ${name.padEnd(56)} ${gb(rate)}  ${(100 * rate / plain).toFixed(0).padStart(7)}%` +
        `  ${(100 * rate / disk).toFixed(0).padStart(6)}%`,
    );
  }
  console.log(`  ${"disk write + fsync, 8 MiB writes (build/)".padEnd(56)} ${gb(disk)}`);
  console.log(
    `  (wall clock includes process start and the API calls; load average now ${load()})`,
  );

  // SHA-256: 256 MB in memory, hashed in 8 MiB calls.
  const data = new Uint8Array(256e6);
  for (let i = 0; i < data.length; i += 4096) data[i] = i >>> 12;
  const machine = await opensslRate();
  const three = async (impl: "libk3" | "node") =>
    median([await shaRate(data, impl), await shaRate(data, impl), await shaRate(data, impl)]);
  const sha: [string, number][] = [];
  sha.push([`libk3 k3_sha256_blocks (${sha256Impl()})`, await three("libk3")]);
  Deno.env.set("K3_ISA", "scalar");
  sha.push([`libk3 k3_sha256_blocks (${sha256Impl()}, K3_ISA=scalar)`, await three("libk3")]);
  Deno.env.delete("K3_ISA");
  sha.push(["node:crypto sha256 (Deno's built-in)", await three("node")]);
  console.log(`SHA-256, 256 MB in memory in 8 MiB calls, load average ${load()}`);
  for (const [name, rate] of sha) {
    const vs = machine ? `  ${(100 * rate / machine).toFixed(0).padStart(4)}% of openssl` : "";
    console.log(`  ${name.padEnd(56)} ${gb(rate)}${vs}`);
  }
  if (machine) {
    console.log(`  ${"openssl speed -evp sha256 (this CPU's best)".padEnd(56)} ${gb(machine)}`);
  }
} finally {
  await hub.close();
}
