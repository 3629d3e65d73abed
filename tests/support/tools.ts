/**
 * System tools some tests drive (tmux, the aarch64 cross tools, qemu-user, mingw-w64, wine). `make test` installs
 * nothing on the system: `make deps-test` installs these. Without one, a test prints a line
 * saying it skipped, what is missing and how to install it. .ci/run installs them and sets
 * K3_REQUIRE_TEST_TOOLS=1, so there a missing tool fails its test instead: CI runs every test.
 */

/** A tool a test needs, how to tell it is here, and the Debian package that brings it. */
export interface SystemTool {
  name: string;
  debianPackage: string;
  present: () => boolean;
}

/** True when every named program is a file in a folder of PATH. */
export function havePrograms(...names: string[]): boolean {
  const folders = (Deno.env.get("PATH") ?? "").split(":").filter((d) => d !== "");
  return names.every((name) => folders.some((folder) => isFile(`${folder}/${name}`)));
}

function isFile(file: string): boolean {
  try {
    return Deno.statSync(file).isFile;
  } catch {
    return false;
  }
}

/** A program on PATH. */
function program(name: string, debianPackage: string): SystemTool {
  return { name, debianPackage, present: () => havePrograms(name) };
}

export const TMUX = program("tmux", "tmux");

/** What `make test-arm` builds and runs the NEON harness with. */
export const ARM_TOOLS: SystemTool[] = [
  program("aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu"),
  {
    // The harness links statically: the cross C library, not just the compiler.
    name: "the aarch64 C library (/usr/aarch64-linux-gnu/lib/libc.a)",
    debianPackage: "libc6-dev-arm64-cross",
    present: () => isFile("/usr/aarch64-linux-gnu/lib/libc.a"),
  },
  program("qemu-aarch64", "qemu-user"),
];

/** What `make test-windows` builds the Windows libk3 and launcher with, and runs them under. */
export const WINDOWS_TOOLS: SystemTool[] = [
  program("x86_64-w64-mingw32-gcc", "gcc-mingw-w64-x86-64"),
  {
    name: "zlib for mingw (/usr/x86_64-w64-mingw32/include/zlib.h)",
    debianPackage: "libz-mingw-w64-dev",
    present: () => isFile("/usr/x86_64-w64-mingw32/include/zlib.h"),
  },
  program("wine", "wine"),
  program("winepath", "wine"),
];

/** True when CI asked for every test to run (a missing tool then fails its test). */
function required(): boolean {
  return Deno.env.get("K3_REQUIRE_TEST_TOOLS") === "1";
}

/**
 * For Deno.test's `ignore`: true when `available` is false, after printing a line saying that
 * `what` was skipped and how to get the tools (`install`). Never true when
 * K3_REQUIRE_TEST_TOOLS=1: the test runs and fails on what is missing.
 */
export function skipUnless(available: boolean, what: string, install: string): boolean {
  if (available || required()) return false;
  console.log(`SKIPPED: ${what}; tools missing, install them with ${install}`);
  return true;
}

/** The tools of `tools` that are missing, named with their packages; empty when all are here. */
export function missingTools(tools: SystemTool[]): string {
  return tools.filter((t) => !t.present())
    .map((t) => `${t.name} (Debian package ${t.debianPackage})`).join(", ");
}

/**
 * {@link skipUnless} for the test `name` and `tools`: the line names each missing tool and
 * its package, and `make deps-test`.
 */
export function skipWithout(name: string, tools: SystemTool[]): boolean {
  const missing = missingTools(tools);
  return skipUnless(missing === "", `"${name}" needs ${missing}`, "`make deps-test`");
}

/** Throws, naming what is missing and how to install it, unless every tool is here. */
export function requireTools(tools: SystemTool[]): void {
  const missing = missingTools(tools);
  if (missing !== "") {
    throw new Error(`missing ${missing}; install the test tools with \`make deps-test\``);
  }
}
