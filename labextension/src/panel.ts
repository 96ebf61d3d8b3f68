// The Horovod side panel (every run of this server's kernels) and a run's own tab.

import { Widget } from '@lumino/widgets';

import { askWindow, getRun, getTimeline, stacks, stop } from './api';
import {
  Answers,
  details,
  going,
  heading,
  Overview,
  perRankByDefault,
  RunRow,
  sessionLines
} from './runs';
import { CurvesSection } from './curves';
import { TimelineSection } from './timeline';

/** The side panel: a card per run, live ones first; a click opens the run's tab. */
export class RunsPanel extends Widget {
  private runs: RunRow[] = [];
  private selected: string | null = null;
  private readonly list: HTMLElement;
  private readonly sessions: HTMLElement;
  private readonly empty: HTMLElement;

  constructor(private readonly openRun: (run: RunRow) => void) {
    super();
    this.id = 'hvd-magic-panel';
    this.addClass('hvd-panel');
    this.title.caption = 'Horovod runs';
    const title = document.createElement('h2');
    title.textContent = 'Horovod runs';
    this.empty = document.createElement('p');
    this.empty.className = 'hvd-empty';
    this.empty.textContent = "No runs in this server's kernels yet: run a %%horovod cell.";
    this.sessions = document.createElement('div');
    this.sessions.className = 'hvd-sessions';
    this.list = document.createElement('div');
    this.list.className = 'hvd-runs';
    this.node.append(title, this.empty, this.sessions, this.list);
  }

  showOverview(overview: Overview): void {
    this.sessions.replaceChildren(
      ...overview.sessions.map(session => {
        const card = document.createElement('div');
        card.className = 'hvd-session';
        for (const [index, text] of sessionLines(session).entries()) {
          const line = document.createElement('div');
          line.className = index ? 'hvd-going' : 'hvd-heading';
          line.textContent = text;
          card.append(line);
        }
        return card;
      })
    );
    this.showRuns(overview.runs);
    this.empty.hidden = overview.runs.length + overview.sessions.length > 0;
  }

  private showRuns(runs: RunRow[]): void {
    this.runs = runs;
    this.list.replaceChildren(...runs.map(run => this.card(run)));
  }

  private card(run: RunRow): HTMLElement {
    const card = document.createElement('div');
    card.className = `hvd-run hvd-${run.state}` + (run.id === this.selected ? ' hvd-selected' : '');
    card.dataset.id = run.id;
    card.dataset.state = run.state;
    card.title = 'Open its view';
    const lines: [string, string][] = [
      ['hvd-heading', heading(run)],
      ['hvd-going', going(run)],
      ...details(run).map((line): [string, string] => ['hvd-detail', line]),
      ['hvd-summary', run.summary]
    ];
    for (const [name, text] of lines) {
      if (text) {
        const line = document.createElement('div');
        line.className = name;
        line.textContent = text;
        card.append(line);
      }
    }
    card.onclick = () => {
      this.selected = run.id;
      this.showRuns(this.runs);
      this.openRun(run);
    };
    return card;
  }
}

/**
 * A run's tab: its view (the kernel's own rendering of its grid and logs; its curves drawn with
 * plotly from the live view's own traces), its timeline (the notebook's viewer) when it writes
 * one, and its buttons.
 */
export class RunView extends Widget {
  private readonly body: HTMLElement;
  private readonly said: HTMLElement;
  private readonly output: HTMLPreElement;
  private perRank: boolean;
  private timer: ReturnType<typeof setInterval> | null = null;
  private ended = false;
  private timeline: TimelineSection | null = null;
  private readonly curves = new CurvesSection();
  private readonly answers = new Answers<boolean>();

  constructor(
    readonly run: RunRow,
    openNotebook: (path: string) => void
  ) {
    super();
    this.addClass('hvd-view');
    this.id = `hvd-magic-run-${run.id.replace('/', '-')}`;
    const notebook = run.notebook.split('/').pop()?.replace(/\.ipynb$/, '');
    this.title.label = notebook ? `${notebook}: run ${run.number}` : `Horovod run ${run.number}`;
    this.title.caption = `Horovod run ${run.number} of ${run.notebook || `kernel ${run.kernel}`}`;
    this.title.closable = true;
    this.perRank = perRankByDefault(run.ranks);
    const bar = document.createElement('div');
    bar.className = 'hvd-buttons';
    const button = (label: string, action: () => void): HTMLButtonElement => {
      const element = document.createElement('button');
      element.className = 'jp-Button hvd-button';
      element.textContent = label;
      element.onclick = action;
      bar.append(element);
      return element;
    };
    button('Stop gracefully', () => this.act(stop(run.id, false).then(a => a.asked)));
    button('Stop now', () => this.act(stop(run.id, true).then(a => a.asked)));
    button('Stacks', () => this.act(stacks(run.id).then(a => a.stacks), true));
    if (run.notebook) {
      button('Open notebook', () => openNotebook(run.notebook));
    }
    const label = () => (this.perRank ? 'Mean curve only' : 'Every rank');
    const toggle = button(label(), () => {
      this.perRank = !this.perRank;
      toggle.textContent = label();
      this.refresh();
    });
    this.said = document.createElement('div');
    this.said.className = 'hvd-said';
    this.output = document.createElement('pre');
    this.output.className = 'hvd-stacks';
    this.body = document.createElement('div');
    this.body.className = 'hvd-view-body';
    this.node.append(bar, this.said, this.output, this.body);
    this.refresh();
    this.timer = setInterval(() => this.refresh(), 1000);
  }

  private act(asked: Promise<string>, long = false): void {
    this.said.textContent = long ? 'asking every rank…' : '';
    asked
      .then(text => {
        if (long) {
          this.output.textContent = text;
          this.said.textContent = '';
        } else {
          this.said.textContent = text;
        }
      })
      .catch(error => {
        this.said.textContent = String(error.message || error);
      });
  }

  refresh(): void {
    const ask = this.answers.ask();
    const perRank = this.perRank;
    getRun(this.run.id, perRank)
      .then(run => {
        if (!this.answers.draws(ask, perRank, this.perRank)) {
          return; // a late answer to an older ask: the view has moved on
        }
        this.body.innerHTML = run.html || '';
        // the curves between the grid and the logs, where the kernel's HTML leaves them a place
        (this.body.querySelector('.hvd-curves-here') ?? this.body).append(this.curves.node);
        this.curves.show(run.curves);
        this.node.dataset.state = run.state;
        this.showTimeline(run);
        if (run.state === 'ended') {
          this.said.textContent =
            `${run.outcome}` + (run.has_value ? ` · rank 0's value: ${run.value}` : '');
          if (!this.ended) {
            this.ended = true; // one more draw of the final record, then no more asking
          } else if (this.timer !== null) {
            clearInterval(this.timer);
            this.timer = null;
          }
        }
      })
      .catch(error => {
        this.said.textContent = String(error.message || error);
      });
  }

  private showTimeline(run: RunRow): void {
    if (run.timeline && this.timeline === null) {
      this.timeline = new TimelineSection(
        version => getTimeline(this.run.id, version),
        content => askWindow(this.run.id, content)
      );
      this.node.append(this.timeline.node);
    }
    this.timeline?.refresh();
  }

  dispose(): void {
    if (this.timer !== null) {
      clearInterval(this.timer);
    }
    this.timeline?.dispose();
    this.curves.dispose();
    super.dispose();
  }
}
