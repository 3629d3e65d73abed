/**
 * `make asan` runs this first and expects it to die: a deliberate heap overflow through FFI
 * (k3_add over 4096 floats of a 64-byte block) must be reported by AddressSanitizer. It
 * proves the sanitized libk3 is the one loaded and the ASan runtime is live under Deno, so
 * a green `make asan` means something. Not a test file (deno test does not pick it up).
 */
const lib = Deno.dlopen(Deno.env.get("K3_LIB")!, {
  k3_alloc: { parameters: ["i64"], result: "pointer" },
  k3_add: { parameters: ["pointer", "pointer", "i32"], result: "void" },
});
const a = lib.symbols.k3_alloc(64n), b = lib.symbols.k3_alloc(64n);
lib.symbols.k3_add(a, b, 4096);
console.log("asan probe: the overflow was NOT detected");
