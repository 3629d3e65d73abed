/**
 * Finds and opens libk3 once per process.
 *
 * Lookup order: the `K3_LIB` environment variable, then `build/libk3.so` (`.dylib` on macOS,
 * `.dll` on Windows) next to this checkout. The thread team (OpenMP or libk3's own pool)
 * reads `OMP_NUM_THREADS` when the library loads, so a thread count must be chosen before
 * the first call to {@link k3}.
 */
import { fileURLToPath } from "node:url";
import { symbols } from "./symbols.ts";

export type K3Library = Deno.DynamicLibrary<typeof symbols>;

let library: K3Library | undefined;

/** Path of the library this process loads (or would load). */
export function libraryPath(): string {
  const override = Deno.env.get("K3_LIB");
  if (override) return override;
  return fileURLToPath(new URL(`../build/${libraryFileName()}`, import.meta.url));
}

/** libk3's file name on this OS: what `make` builds and the dist executables carry. */
export function libraryFileName(os: typeof Deno.build.os = Deno.build.os): string {
  if (os === "windows") return "libk3.dll";
  return os === "darwin" ? "libk3.dylib" : "libk3.so";
}

/**
 * Sets the kernels' team size for this process. Only effective before the library loads;
 * afterwards it throws, because the team (libgomp or libk3's pool) has already read the
 * environment.
 */
export function setThreads(threads: number): void {
  if (library) {
    if (k3Threads() === threads) return;
    throw new Error(`libk3 is already loaded with ${k3Threads()} threads; set threads first`);
  }
  Deno.env.set("OMP_NUM_THREADS", String(threads));
}

/**
 * libk3 could not be loaded: not built, not found, or no --allow-ffi. The CLI reports it as
 * bad input (exit 2); the message says how to fix it.
 */
export class LibraryLoadError extends Error {
  constructor(readonly path: string, cause: unknown) {
    const denied = cause instanceof Deno.errors.NotCapable ||
      cause instanceof Deno.errors.PermissionDenied;
    const repo = fileURLToPath(new URL("..", import.meta.url));
    super(
      denied
        ? `cannot load libk3: run deno with --allow-ffi (and --allow-read, --allow-env)`
        : `cannot load libk3 from ${path}: build it with \`make\` in ${repo} (needs a C ` +
          `compiler with OpenMP, e.g. gcc), or point K3_LIB at a built libk3`,
      { cause },
    );
    this.name = "LibraryLoadError";
  }
}

/** The loaded library's symbols. Opens it on first use. */
export function k3(): K3Library["symbols"] {
  if (!library) {
    // Idle OpenMP threads spin briefly, then sleep: a long spin steals the core the next
    // parallel region needs on a small shared machine (measured: router 8 ms vs 0.5 ms), and
    // no spin at all costs 30-55 us to wake a thread per call. libgomp reads this once, at
    // load; a user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT wins.
    if (!Deno.env.get("OMP_WAIT_POLICY") && !Deno.env.get("GOMP_SPINCOUNT")) {
      Deno.env.set("GOMP_SPINCOUNT", "10000");
    }
    const path = libraryPath();
    try {
      library = Deno.dlopen(path, symbols);
    } catch (cause) {
      throw new LibraryLoadError(path, cause);
    }
  }
  return library.symbols;
}

/** Reads a static C string returned by the library. */
export function cString(p: Deno.PointerValue): string {
  return p === null ? "" : Deno.UnsafePointerView.getCString(p);
}

/** The kernels' team size in effect. */
export function k3Threads(): number {
  return k3().k3_num_threads();
}

/** The SIMD path libk3 selected ("scalar", "avx2", "avx512", "neon"). */
export function k3Isa(): string {
  return cString(k3().k3_isa());
}

/** libk3's version string. */
export function k3Version(): string {
  return cString(k3().k3_version());
}
