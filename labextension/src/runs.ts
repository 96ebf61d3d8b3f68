// What the Horovod panel shows of a run: pure functions of the server's JSON (unit-tested).

/** One run as GET /hvd-magic/runs lists it (hvd_magic.run.endpoint.row, with its ids). */
export interface RunRow {
  id: string; // KERNEL/NUMBER
  kernel: string;
  notebook: string;
  number: number;
  where: string;
  ranks: number;
  launcher?: string; // what launched it: "local · Horovod (Gloo)", "Spark yarn · Horovod (mpirun)"
  state: 'running' | 'ended';
  outcome: string;
  began: number; // seconds since the epoch
  seconds: number;
  summary: string;
  has_value: boolean;
  value: string;
  cell?: string; // the notebook cell's id, where JupyterLab sent it
  hosts?: string[];
  step?: number | null;
  total?: number | null;
  epoch?: number | null;
  steps_per_s?: number | null;
  eta?: number | null;
  cpu?: number | null;
  memory?: number | null;
  gpu?: string;
  slow?: string;
  attempt?: string;
  counts?: Record<string, number>;
  html?: string;
  curves?: Record<string, object[]>; // each metric's plotly traces (the run's tab draws them)
  timeline?: boolean; // the run writes a Horovod Timeline (its tab shows it)
}

/** A live session as the server lists it (hvd_magic.session.ranks.panel_row, with its kernel). */
export interface SessionRow {
  kernel: string;
  notebook: string;
  where: string;
  ranks: number;
  hosts: string[];
  state: string; // "idle", "running a cell"
  cells: number;
  seconds: number;
  cpu?: number | null;
  memory?: number | null;
  gpu?: string;
  launcher: string;
}

/** What the server sends: its kernels' runs and live sessions. */
export interface Overview {
  runs: RunRow[];
  sessions: SessionRow[];
}

/** "0:42", "1:02:03". */
export function duration(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined) {
    return '';
  }
  const s = Math.floor(seconds);
  const mm = String(Math.floor(s / 60) % 60).padStart(2, '0');
  const ss = String(s % 60).padStart(2, '0');
  return s >= 3600 ? `${Math.floor(s / 3600)}:${mm}:${ss}` : `${Math.floor(s / 60)}:${ss}`;
}

/** "1.2 GB", "340 MB". */
export function bytes(value: number | null | undefined): string {
  if (!value) {
    return '';
  }
  return value >= 2 ** 30 ? `${(value / 2 ** 30).toFixed(1)} GB` : `${Math.round(value / 2 ** 20)} MB`;
}

/** "12/40", "12", "" */
export function progress(run: RunRow): string {
  if (run.step === null || run.step === undefined) {
    return '';
  }
  return run.total ? `${run.step}/${run.total}` : `${run.step}`;
}

/** The notebook's path, or the kernel's id where no notebook is open on it. */
export function notebookName(run: { notebook: string; kernel: string }): string {
  return run.notebook || `kernel ${run.kernel.slice(0, 8)}`;
}

/** The one line of health: CPU, memory, GPU; empty where the ranks said nothing yet. */
export function health(run: { cpu?: number | null; memory?: number | null; gpu?: string }): string {
  const parts = [];
  if (run.cpu !== null && run.cpu !== undefined) {
    parts.push(`CPU ${Math.round(run.cpu)} %`);
  }
  if (run.memory) {
    parts.push(`mem ${bytes(run.memory)}`);
  }
  if (run.gpu) {
    parts.push(`GPU ${run.gpu}`);
  }
  return parts.join(' · ');
}

/** A run's card in the panel: its heading, then how it goes (or went). */
export function heading(run: RunRow): string {
  const state = run.state === 'running' ? 'running' : run.outcome;
  const where = run.hosts && run.hosts.length ? `${run.where} (${run.hosts.join(', ')})` : run.where;
  return `#${run.number} ${notebookName(run)} · ${where} · ${state}`;
}

export function going(run: RunRow): string {
  const parts = [];
  const step = progress(run);
  if (step) {
    parts.push(`step ${step}`);
  }
  if (run.epoch !== null && run.epoch !== undefined) {
    parts.push(`epoch ${run.epoch}`);
  }
  if (run.state === 'running') {
    if (run.steps_per_s) {
      parts.push(`${run.steps_per_s.toFixed(2)} steps/s`);
    }
    if (run.eta !== null && run.eta !== undefined) {
      parts.push(`ETA ${duration(run.eta)}`);
    }
    const shown = health(run);
    if (shown) {
      parts.push(shown);
    }
  } else {
    parts.push(`took ${duration(run.seconds)}`);
  }
  return parts.join(' · ');
}

/** How many of the runs are live: what the status bar says. */
export function liveCount(runs: RunRow[]): number {
  return runs.filter(run => run.state === 'running').length;
}

/** The status bar's text. */
export function statusText(overview: Overview): string {
  const sessions = overview.sessions.length;
  const more = sessions ? ` · ${sessions} session${sessions > 1 ? 's' : ''}` : '';
  return `Horovod: ${liveCount(overview.runs)} live${more}`;
}

/** A live session's card: its heading, then its ranks' state. */
export function sessionLines(session: SessionRow): string[] {
  const hosts = session.hosts.length ? ` (${session.hosts.join(', ')})` : '';
  const shown = [`${session.state}`, `${session.cells} cells`, `up ${duration(session.seconds)}`];
  const figures = health(session);
  return [
    `${notebookName(session)} · ${session.where}${hosts} · ${session.launcher}`,
    [...shown, ...(figures ? [figures] : [])].join(' · ')
  ];
}

/** The lines under a run's heading: what launched it, the straggler, the attempt, the value. */
export function details(run: RunRow): string[] {
  const lines = [];
  if (run.launcher) {
    lines.push(run.launcher);
  }
  if (run.slow) {
    lines.push(run.slow);
  }
  if (run.attempt) {
    lines.push(run.attempt);
  }
  if (run.state === 'ended') {
    lines.push(run.has_value ? `rank 0's value: ${run.value}` : 'no value (it did not finish)');
  }
  return lines;
}

/** Large runs show the mean curve first; per-rank curves on demand. */
export function perRankByDefault(ranks: number): boolean {
  return ranks <= 16;
}

/**
 * Which of a view's overlapping answers it draws: asks overlap (one a second, and one at each
 * click), and an older answer that comes late would draw what the view showed before (the mean
 * curve just after "Every rank", the compact grid after its rows). An answer is drawn only if it
 * is newer than the last drawn and was asked for what the view shows now.
 */
export class Answers<Mode> {
  private asked = 0;
  private drawn = 0;

  /** A new ask, for the view's mode now; give its number to `draws` with the answer. */
  ask(): number {
    return ++this.asked;
  }

  draws(ask: number, askedFor: Mode, now: Mode): boolean {
    if (ask <= this.drawn || askedFor !== now) {
      return false;
    }
    this.drawn = ask;
    return true;
  }
}
