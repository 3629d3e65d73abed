/**
 * Writes the Windows single executable: the launcher (csrc/launcher/windows.c), then every
 * file under a staging folder as one gzip stream, then the trailer the launcher reads.
 * usage: deno run -A scripts/pack_windows.ts LAUNCHER.exe STAGE_DIR OUT.exe
 * Payload, before compression: per file, u32 path length, UTF-8 path ('/'), u64 size, the
 * bytes; a u32 0 ends it. Trailer: "K3PACK01", u64 payload offset, u64 payload length, 16 hex
 * characters of the payload's SHA-256 (the version the launcher unpacks under).
 */
import { createHash } from "node:crypto";
import * as path from "node:path";

const [launcher, stage, out] = Deno.args;
if (!launcher || !stage || !out) {
  console.error("usage: pack_windows.ts LAUNCHER.exe STAGE_DIR OUT.exe");
  Deno.exit(2);
}

/** Every file under `dir`, relative, '/'-separated, in a stable order. */
async function* files(dir: string, rel = ""): AsyncGenerator<string> {
  const entries = [];
  for await (const e of Deno.readDir(path.join(dir, rel))) entries.push(e);
  entries.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  for (const e of entries) {
    const child = rel ? `${rel}/${e.name}` : e.name;
    const info = await Deno.stat(path.join(dir, child)); // follows symlinks: copies their target
    if (info.isDirectory) yield* files(dir, child);
    else if (info.isFile) yield child;
  }
}

function u32(n: number): Uint8Array {
  const b = new Uint8Array(4);
  new DataView(b.buffer).setUint32(0, n, true);
  return b;
}

function u64(n: number): Uint8Array {
  const b = new Uint8Array(8);
  new DataView(b.buffer).setBigUint64(0, BigInt(n), true);
  return b;
}

/** The uncompressed payload, chunk by chunk. */
async function* payload(): AsyncGenerator<Uint8Array> {
  for await (const rel of files(stage)) {
    const name = new TextEncoder().encode(rel);
    const data = await Deno.readFile(path.join(stage, rel));
    yield u32(name.length);
    yield name;
    yield u64(data.length);
    yield data;
  }
  yield u32(0);
}

async function writeAll(file: Deno.FsFile, bytes: Uint8Array): Promise<void> {
  let done = 0;
  while (done < bytes.length) done += await file.write(bytes.subarray(done));
}

const tmp = `${out}.tmp.${Deno.pid}`;
const file = await Deno.open(tmp, { write: true, create: true, truncate: true });
try {
  const head = await Deno.readFile(launcher);
  await writeAll(file, head);
  const hash = createHash("sha256");
  let length = 0;
  // gzip -6, as the other platforms' payloads (smaller than CompressionStream's level).
  const gzip = new Deno.Command("gzip", { args: ["-6", "-c"], stdin: "piped", stdout: "piped" })
    .spawn();
  const feeding = (async () => {
    const writer = gzip.stdin.getWriter();
    for await (const chunk of payload()) await writer.write(chunk);
    await writer.close();
  })();
  for await (const chunk of gzip.stdout) {
    hash.update(chunk);
    length += chunk.length;
    await writeAll(file, chunk);
  }
  await feeding;
  if (!(await gzip.status).success) throw new Error("gzip failed");
  const version = hash.digest("hex").slice(0, 16);
  const trailer = new Uint8Array(40);
  trailer.set(new TextEncoder().encode("K3PACK01"), 0);
  trailer.set(u64(head.length), 8);
  trailer.set(u64(length), 16);
  trailer.set(new TextEncoder().encode(version), 24);
  await writeAll(file, trailer);
  file.close();
  await Deno.rename(tmp, out);
} catch (e) {
  file.close();
  await Deno.remove(tmp).catch(() => {});
  throw e;
}
