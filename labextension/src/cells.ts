// A reopened notebook's cell whose run goes on (or ended while no tab was open) says so: a line
// on the cell, which opens the run's tab. The cell's output of that time cannot come back (Jupyter
// delivers output only to the tabs open then); the run's view can.

import type { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';

import { RunRow } from './runs';

const BANNER = 'hvd-cell-banner';

/** The line a cell of ``run`` shows. */
export function bannerText(run: RunRow): string {
  if (run.state === 'running') {
    const step = run.step !== null && run.step !== undefined ? ` at step ${run.step}${run.total ? `/${run.total}` : ''}` : '';
    return `hvd_magic: run ${run.number} of this cell goes on${step}; its live view: click here (or the Horovod panel)`;
  }
  const value = run.has_value ? `, rank 0's value: ${run.value}` : '';
  return `hvd_magic: run ${run.number} of this cell ${run.outcome}${value}; its record: click here (or %horovod last)`;
}

export class CellBanners {
  constructor(
    private readonly notebooks: INotebookTracker,
    private readonly openRun: (run: RunRow) => void
  ) {}

  /** Each open notebook's cells: a banner on those whose run goes on or ended unseen. */
  show(runs: RunRow[]): void {
    this.notebooks.forEach(panel => this.mark(panel, runs));
  }

  private mark(panel: NotebookPanel, runs: RunRow[]): void {
    const path = panel.context.path;
    const kernel = panel.sessionContext.session?.kernel?.id;
    const mine = new Map<string, RunRow>();
    for (const run of runs) {
      if (run.cell && run.notebook === path && run.kernel === kernel && !mine.has(run.cell)) {
        mine.set(run.cell, run); // the newest first: the server lists live runs, then the newest
      }
    }
    for (const cell of panel.content.widgets) {
      const run = mine.get(cell.model.id);
      let banner = cell.node.querySelector(`:scope > .${BANNER}`) as HTMLElement | null;
      const unseen = run && (run.state === 'running' || cell.model.type !== 'code' || !hasOutput(cell.node));
      if (!run || !unseen) {
        banner?.remove();
        continue;
      }
      if (!banner) {
        banner = document.createElement('div');
        banner.className = BANNER;
        cell.node.append(banner);
      }
      banner.dataset.state = run.state;
      banner.textContent = bannerText(run);
      banner.onclick = () => this.openRun(run);
    }
  }
}

function hasOutput(node: HTMLElement): boolean {
  return node.querySelector('.jp-OutputArea-output') !== null;
}
