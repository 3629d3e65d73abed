/**
 * Run in a child process by tests/memory/full.test.ts: `deno run open_probe.ts` prints the peak RSS
 * (VmHWM) of a bare Deno process; `deno run open_probe.ts DIR` opens the checkpoint in DIR
 * first and prints its peak RSS, wall and CPU time. One JSON line on stdout.
 */
import process from "node:process";

function peakKb(): number {
  const m = /VmHWM:\s+(\d+) kB/.exec(Deno.readTextFileSync("/proc/self/status"));
  return m ? Number(m[1]) : -1;
}

const dir = Deno.args[0];
if (dir === undefined) {
  console.log(JSON.stringify({ peakKb: peakKb() }));
} else {
  const { openCheckpoint } = await import("../../lib/checkpoint/checkpoint.ts");
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  const ckpt = await openCheckpoint(dir);
  const ms = performance.now() - t0;
  const cpu = process.cpuUsage(cpu0);
  console.log(JSON.stringify({
    peakKb: peakKb(),
    ms,
    cpuMs: (cpu.user + cpu.system) / 1000,
    tensors: ckpt.tensorCount,
    layers: ckpt.refs.layers.length,
  }));
}
