/**
 * The safetensors container: an 8-byte little-endian header length, a JSON header mapping
 * tensor names to {dtype, shape, data_offsets}, then the raw tensor bytes. This module reads
 * headers strictly (any inconsistency is bad input naming the file and tensor) and writes
 * whole files atomically for the synthetic checkpoint generator.
 */

import type * as fs from "node:fs/promises";
import { badInput, ExitCode, K3Error } from "../errors.ts";
import { writeAll, writeAtomically } from "../io/atomic.ts";
import { openModelFile } from "./files.ts";
import { type ByteReader, JsonScanner, type StringView, textChunks, viewText } from "./json.ts";
import type { DType } from "./types.ts";

/** Bytes per element of every dtype this project knows. */
export const DTYPE_SIZES: Readonly<Record<DType, number>> = {
  BOOL: 1,
  U8: 1,
  I8: 1,
  I16: 2,
  U16: 2,
  I32: 4,
  U32: 4,
  I64: 8,
  U64: 8,
  F16: 2,
  BF16: 2,
  F32: 4,
  F64: 8,
  F8_E4M3: 1,
  F8_E5M2: 1,
};

/** A header larger than this is refused rather than parsed (the real K3 headers are < 1 MB). */
export const MAX_HEADER_BYTES = 100 * 1024 * 1024;

/** One tensor as described by a header; offsets are relative to the data start. */
export interface HeaderEntry {
  name: string;
  dtype: DType;
  shape: number[];
  /** Byte offset relative to the start of the data section. */
  begin: number;
  end: number;
}

/** A parsed header: where the data section starts, the tensors, and `__metadata__`. */
export interface SafetensorsHeader {
  /** Absolute byte offset of the data section (8 + header length). */
  dataStart: number;
  entries: HeaderEntry[];
  metadata: Record<string, string>;
}

/** True when `s` names a dtype this project knows. */
export function isDType(s: unknown): s is DType {
  return typeof s === "string" && Object.hasOwn(DTYPE_SIZES, s);
}

/** Number of bytes a tensor of this dtype and shape occupies. */
export function tensorBytes(dtype: DType, shape: readonly number[]): number {
  return shape.reduce((n, d) => n * d, DTYPE_SIZES[dtype]);
}

/** Reads the 8-byte little-endian header length, refusing values above MAX_HEADER_BYTES. */
export function readHeaderLength(prefix: Uint8Array, file: string, fileSize: number): number {
  if (prefix.length < 8 || fileSize < 8) {
    throw badInput(`${file}: not a safetensors file (shorter than the 8-byte header length)`);
  }
  const view = new DataView(prefix.buffer, prefix.byteOffset, 8);
  const length = view.getBigUint64(0, true);
  if (length > BigInt(MAX_HEADER_BYTES)) {
    throw badInput(
      `${file}: safetensors header length ${length} exceeds the ${MAX_HEADER_BYTES}-byte limit; ` +
        `the file is corrupt or not safetensors`,
    );
  }
  const n = Number(length);
  if (8 + n > fileSize) {
    throw badInput(
      `${file}: safetensors header length ${n} runs past the end of the file (${fileSize} bytes); ` +
        `the file is truncated or corrupt`,
    );
  }
  return n;
}

/**
 * Receives one header entry. `name` is a view into the header text (see viewText) and `shape` a
 * scratch array, both valid only during the call (copy what you keep). Offsets are relative to
 * the data start.
 */
export type EntryVisitor = (
  name: StringView,
  dtype: DType,
  shape: number[],
  begin: number,
  end: number,
) => void;

/** What a scan returns besides the entries it visited. */
export interface HeaderSummary {
  /** Absolute byte offset of the data section (8 + header length). */
  dataStart: number;
  metadata: Record<string, string>;
  count: number;
}

/**
 * Scans and validates a safetensors header, handing each tensor to `visit` instead of
 * building an object per tensor. Refuses what JSON.parse would silently accept: a field twice
 * in one entry, and (unless `options.duplicates` is "caller") a tensor name twice in one
 * header, which JSON.parse resolves by keeping the last.
 * The header is read in small chunks through `source`, so no copy of it is kept whole.
 * @param source the file's bytes from its start (at least 8 + header length), or a reader
 * @param file the file's path, used in error messages
 * @param fileSize the file's full size, to check that every tensor lies inside it
 * @param options.duplicates "caller": the caller detects repeated names itself (the checkpoint
 *   index does, in its compact tables, without a set of every name)
 * @param options.overlaps "skip": no overlap check (the second pass that names the tensors)
 * @throws K3Error (exit 2) naming the file, the tensor and the field
 */
export function scanSafetensorsHeader(
  source: Uint8Array | ByteReader,
  file: string,
  fileSize: number,
  visit: EntryVisitor,
  options: { duplicates?: "check" | "caller"; overlaps?: "check" | "skip" } = {},
): HeaderSummary {
  const read: ByteReader = source instanceof Uint8Array
    ? (into, position) => {
      const part = source.subarray(position, position + into.length);
      into.set(part);
      return part.length;
    }
    : source;
  const prefix = new Uint8Array(8);
  const length = readHeaderLength(prefix.subarray(0, read(prefix, 0)), file, fileSize);
  const dataStart = 8 + length;
  if (source instanceof Uint8Array && source.length < dataStart) {
    throw badInput(`${file}: only ${source.length} bytes given for a ${dataStart}-byte header`);
  }
  const what = `${file}: safetensors header`;
  const names = options.duplicates === "caller" ? null : new Set<string>();
  const spans = new Spans();
  let metadata: Record<string, string> = {};
  const s = new JsonScanner(what, textChunks(read, 8, dataStart, what));
  if (s.next() !== "object") {
    s.skipValue(); // a syntax error is named as one
    throw badInput(`${file}: safetensors header must be a JSON object`);
  }
  s.beginObject();
  const entry = new EntryScan(s, file);
  for (let i = 0;; i++) {
    const name = s.keyView(i);
    if (name === null) break;
    if (names) {
      const n = viewText(name);
      if (names.has(n)) throw duplicateTensor(file, n);
      names.add(n);
    }
    if (isMetadataKey(name)) {
      metadata = scanMetadata(s, file);
      continue;
    }
    entry.scan(name);
    spans.add(entry.begin, entry.end);
    visit(name, entry.dtype, entry.shape, entry.begin, entry.end);
  }
  s.finish();
  const overlap = spans.check(file, dataStart, fileSize);
  if (overlap && options.overlaps !== "skip") {
    // Name the two tensors (a second pass, on the error path only).
    const found = ["", ""];
    scanSafetensorsHeader(read, file, fileSize, (name, _d, _s, begin, end) => {
      for (const k of [0, 1]) {
        if (found[k] === "" && begin === overlap[2 * k] && end === overlap[2 * k + 1]) {
          found[k] = viewText(name);
          return;
        }
      }
    }, { duplicates: "caller", overlaps: "skip" });
    throw badInput(
      `${file}: tensors ${found[0]} [${overlap[0]}, ${overlap[1]}) and ${found[1]} ` +
        `[${overlap[2]}, ${overlap[3]}) overlap`,
    );
  }
  return { dataStart, metadata, count: spans.count };
}

/** The error for a tensor name repeated inside one header. */
export function duplicateTensor(file: string, name: string): K3Error {
  return badInput(
    `${file}: tensor ${name} appears twice in the safetensors header (JSON readers silently ` +
      `keep one of them); the file is corrupt or was written wrongly: download it again`,
  );
}

function isMetadataKey(v: StringView): boolean {
  return v.end - v.start === 12 && v.text.startsWith("__metadata__", v.start);
}

/**
 * Parses and validates a safetensors header into one entry per tensor (small files; the
 * checkpoint index uses scanSafetensorsHeader).
 */
export function parseSafetensorsHeader(
  bytes: Uint8Array,
  file: string,
  fileSize: number,
): SafetensorsHeader {
  const entries: HeaderEntry[] = [];
  const { dataStart, metadata } = scanSafetensorsHeader(
    bytes,
    file,
    fileSize,
    (name, dtype, shape, begin, end) =>
      entries.push({ name: viewText(name), dtype, shape: shape.slice(), begin, end }),
  );
  return { dataStart, entries, metadata };
}

/**
 * Reads the header bytes of an open safetensors file (the 8-byte length, then the JSON).
 * @returns the bytes (8 + header length) and the file's size
 */
export async function readHeaderBytes(
  handle: fs.FileHandle,
  file: string,
): Promise<{ bytes: Uint8Array; size: number }> {
  const { size } = await handle.stat();
  const prefix = await readExactly(handle, 0, Math.min(8, size));
  const length = readHeaderLength(prefix, file, size);
  return { bytes: await readExactly(handle, 0, 8 + length), size };
}

/** Reads just the header of a safetensors file on disk (never blocks on a FIFO). */
export async function readSafetensorsHeader(file: string): Promise<SafetensorsHeader> {
  const handle = await openModelFile(file, "safetensors file");
  try {
    const { bytes, size } = await readHeaderBytes(handle, file);
    return parseSafetensorsHeader(bytes, file, size);
  } finally {
    await handle.close();
  }
}

async function readExactly(
  handle: fs.FileHandle,
  position: number,
  n: number,
): Promise<Uint8Array> {
  const buf = new Uint8Array(n);
  let done = 0;
  while (done < n) {
    const { bytesRead } = await handle.read(buf, done, n - done, position + done);
    if (bytesRead === 0) break;
    done += bytesRead;
  }
  return buf.subarray(0, done);
}

function scanMetadata(s: JsonScanner, file: string): Record<string, string> {
  const bad = () => badInput(`${file}: safetensors __metadata__ must be an object of strings`);
  if (s.next() !== "object") throw bad();
  s.beginObject();
  const out: Record<string, string> = {};
  for (let i = 0;; i++) {
    const k = s.key(i);
    if (k === null) return out;
    if (Object.hasOwn(out, k)) {
      throw badInput(`${file}: safetensors __metadata__ has the key ${JSON.stringify(k)} twice`);
    }
    if (s.next() !== "string") throw bad();
    out[k] = s.string();
  }
}

function isNonNegativeInt(v: number): boolean {
  return Number.isSafeInteger(v) && v >= 0;
}

const DTYPE_NAMES = Object.keys(DTYPE_SIZES) as DType[];
/** Fields of a header entry, in the order of EntryScan's field numbers. */
const FIELDS = ["dtype", "shape", "data_offsets"];

/** Reads one tensor's entry {dtype, shape, data_offsets} and checks it; other fields are skipped. */
class EntryScan {
  dtype: DType = "U8";
  readonly shape: number[] = [];
  begin = 0;
  end = 0;
  readonly #offsets: number[] = [];

  constructor(readonly s: JsonScanner, readonly file: string) {}

  scan(nameView: StringView): void {
    const s = this.s;
    const at = s.position;
    if (this.#fast()) return this.#check(nameView);
    s.rewind(at);
    this.#general(nameView);
    this.#check(nameView);
  }

  /**
   * The compact form every writer produces, `{"dtype":"U8","shape":[3072,1792],
   * "data_offsets":[0,5505024]}`, read without the general scanner. False on anything else.
   */
  #fast(): boolean {
    const s = this.s;
    if (!s.tryLiteral('{"dtype":"')) return false;
    const dtype = s.tryStringIn(DTYPE_NAMES);
    if (dtype < 0 || !s.tryLiteral(',"shape":[')) return false;
    const shape = this.shape;
    shape.length = 0;
    if (!s.tryLiteral("]")) {
      for (;;) {
        const d = s.tryUint();
        if (d < 0) return false;
        shape.push(d);
        if (s.tryLiteral("]")) break;
        if (!s.tryLiteral(",")) return false;
      }
    }
    if (!s.tryLiteral(',"data_offsets":[')) return false;
    const begin = s.tryUint();
    if (begin < 0 || !s.tryLiteral(",")) return false;
    const end = s.tryUint();
    if (end < 0 || !s.tryLiteral("]}")) return false;
    this.dtype = DTYPE_NAMES[dtype];
    this.begin = begin;
    this.end = end;
    return true;
  }

  /** Any valid JSON form: fields in any order, whitespace, extra fields (skipped). */
  #general(nameView: StringView): void {
    const s = this.s;
    const where = () => `${this.file}: tensor ${viewText(nameView)}`;
    if (s.next() !== "object") {
      s.skipValue();
      throw badInput(`${where()}: header entry must be an object`);
    }
    s.beginObject();
    let seen = 0, dtype = -1, shapeOk = false, offsetsOk = false;
    let dtypeText = "(missing)", shapeText = "(missing)", offsetsText = "(missing)";
    for (let i = 0;; i++) {
      const field = s.keyIn(i, FIELDS);
      if (field === -2) break;
      if (field === -1) {
        s.skipValue();
        continue;
      }
      if (seen & (1 << field)) {
        throw badInput(`${where()}: the field "${FIELDS[field]}" appears twice`);
      }
      seen |= 1 << field;
      if (field === 0) {
        if (s.next() === "string") {
          dtype = s.stringIn(DTYPE_NAMES);
          if (dtype < 0) dtypeText = JSON.stringify(s.other);
        } else dtypeText = s.skipValue();
      } else if (field === 1) {
        shapeOk = s.numbers(this.shape) && this.shape.every(isNonNegativeInt);
        shapeText = s.other;
      } else {
        offsetsOk = s.numbers(this.#offsets) && this.#offsets.length === 2 &&
          this.#offsets.every(isNonNegativeInt);
        offsetsText = s.other;
      }
    }
    if (dtype < 0) throw badInput(`${where()}: unknown dtype ${dtypeText}`);
    if (!shapeOk) {
      const found = seen & 2 && this.shape.length > 0 ? JSON.stringify(this.shape) : shapeText;
      throw badInput(`${where()}: shape must be a list of non-negative integers, found ${found}`);
    }
    if (!offsetsOk) {
      const found = seen & 4 && this.#offsets.length > 0
        ? JSON.stringify(this.#offsets)
        : offsetsText;
      throw badInput(
        `${where()}: data_offsets must be [begin, end] non-negative integers, found ${found}`,
      );
    }
    this.dtype = DTYPE_NAMES[dtype];
    this.begin = this.#offsets[0];
    this.end = this.#offsets[1];
  }

  /** The checks both forms share. */
  #check(nameView: StringView): void {
    const where = () => `${this.file}: tensor ${viewText(nameView)}`;
    const { begin, end } = this;
    if (end < begin) throw badInput(`${where()}: data_offsets end ${end} is before begin ${begin}`);
    const expected = tensorBytes(this.dtype, this.shape);
    if (end - begin !== expected) {
      throw badInput(
        `${where()}: shape [${this.shape}] x ${this.dtype} is ${expected} bytes but data_offsets ` +
          `span ${end - begin} bytes`,
      );
    }
  }
}

/**
 * The byte ranges of one header's tensors: no two may overlap, and the file must hold the last
 * one (else it is truncated).
 */
class Spans {
  #begin: number[] = [];
  #end: number[] = [];

  get count(): number {
    return this.#begin.length;
  }

  add(begin: number, end: number): void {
    this.#begin.push(begin);
    this.#end.push(end);
  }

  /**
   * Throws for a truncated file.
   * @returns the first overlapping pair as [begin1, end1, begin2, end2], or null
   */
  check(file: string, dataStart: number, fileSize: number): number[] | null {
    const begin = this.#begin, end = this.#end;
    let order: number[] | null = null;
    // Writers lay tensors out in order, so this is usually sorted already.
    for (let i = 1; i < begin.length && !order; i++) {
      if (begin[i] < begin[i - 1]) order = [];
    }
    if (order) {
      order = Array.from({ length: begin.length }, (_, i) => i);
      order.sort((a, b) => begin[a] - begin[b]);
    }
    let last = 0, prev = -1;
    for (let j = 0; j < begin.length; j++) {
      const cur = order ? order[j] : j;
      if (end[cur] === begin[cur]) continue;
      if (prev >= 0 && begin[cur] < end[prev]) {
        return [begin[prev], end[prev], begin[cur], end[cur]];
      }
      if (prev < 0 || end[cur] > end[prev]) prev = cur;
      last = Math.max(last, end[cur]);
    }
    const needed = dataStart + last;
    if (fileSize < needed) {
      throw badInput(
        `${file}: truncated: the file is ${fileSize} bytes but its header needs ${needed} ` +
          `bytes; download or copy it again`,
      );
    }
    return null;
  }
}

/** A caller bug in the writer (not user input). */
function internalError(message: string): K3Error {
  return new K3Error(message, ExitCode.internal);
}

/**
 * Builds a safetensors header for tensors laid back to back in the given order.
 * @returns the full header (8-byte length + JSON padded with spaces to a multiple of 8) and
 *   each tensor's data offset relative to the start of the data section
 */
export function buildHeader(
  entries: { name: string; dtype: DType; shape: number[]; nbytes: number }[],
  metadata?: Record<string, string>,
): { header: Uint8Array; dataOffsets: number[] } {
  const json: Record<string, unknown> = {};
  if (metadata) json.__metadata__ = metadata;
  const dataOffsets: number[] = [];
  let offset = 0;
  for (const e of entries) {
    if (Object.hasOwn(json, e.name)) throw internalError(`buildHeader: duplicate tensor ${e.name}`);
    const expected = tensorBytes(e.dtype, e.shape);
    if (expected !== e.nbytes) {
      throw internalError(
        `buildHeader: ${e.name} shape [${e.shape}] x ${e.dtype} is ${expected} bytes, given ${e.nbytes}`,
      );
    }
    json[e.name] = { dtype: e.dtype, shape: e.shape, data_offsets: [offset, offset + e.nbytes] };
    dataOffsets.push(offset);
    offset += e.nbytes;
  }
  const text = new TextEncoder().encode(JSON.stringify(json));
  const padded = Math.ceil(text.length / 8) * 8;
  const header = new Uint8Array(8 + padded).fill(0x20, 8);
  new DataView(header.buffer).setBigUint64(0, BigInt(padded), true);
  header.set(text, 8);
  return { header, dataOffsets };
}

/**
 * Writes a safetensors file atomically: a temp file in the same directory, fsync, rename.
 * A crash leaves either the old file or the complete new one, never a half-written file.
 */
export async function writeSafetensors(
  file: string,
  tensors: { name: string; dtype: DType; shape: number[]; data: Uint8Array }[],
  metadata?: Record<string, string>,
): Promise<void> {
  const { header } = buildHeader(
    tensors.map((t) => ({ name: t.name, dtype: t.dtype, shape: t.shape, nbytes: t.data.length })),
    metadata,
  );
  await writeAtomically(file, async (out) => {
    await writeAll(out, header);
    for (const t of tensors) await writeAll(out, t.data);
  });
}
