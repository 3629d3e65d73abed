/** The per-step table `k3 run` prints. */
/** One row of the per-step table. */
interface StepRow {
  step: number;
  token: number;
  seconds: number;
  fed: number;
  cacheHitPct?: number;
  gbRead?: number;
  text?: string;
}

export const STEP_HEADER = "STEP   TOKEN     SECONDS    FED   HIT%    READ GB   TOK/S   TEXT";

/** Formats a row under STEP_HEADER. */
export function formatStep(r: StepRow): string {
  const hit = r.cacheHitPct === undefined ? "-" : r.cacheHitPct.toFixed(1);
  const gb = r.gbRead === undefined ? "-" : r.gbRead.toFixed(3);
  const text = r.text === undefined ? "" : JSON.stringify(r.text);
  return `${String(r.step).padEnd(6)} ${String(r.token).padEnd(9)} ${
    r.seconds.toFixed(4).padStart(8)
  }` +
    `  ${String(r.fed).padStart(5)}  ${hit.padStart(5)}  ${gb.padStart(9)}  ${
      (1 / r.seconds).toFixed(2).padStart(6)
    }   ${text}`;
}
