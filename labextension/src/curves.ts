// A run's curves in its tab, drawn by plotly.js from the traces the kernel's live view gives its
// own plotly figure under the cell (hvd_magic.widgets.render.plotted): a chart per metric,
// redrawn in place (Plotly.react) as the tab refreshes. plotly.js is loaded the first time a tab
// draws curves, not with the lab.

export type Traces = Record<string, object[]>;

// a chart's own layout each time: plotly keeps the object it is given and writes a zoom into it; the
// uirevision keeps the user's zoom across the tab's refreshes
const layout = (metric: string) => ({
  height: 280,
  margin: { l: 40, r: 10, t: 10, b: 30 },
  xaxis: { title: { text: 'step' } },
  uirevision: metric
});

type Plotly = {
  react(node: HTMLElement, data: object[], layout: object, config?: object): Promise<unknown>;
  purge(node: HTMLElement): void;
};
let plotly: Promise<Plotly> | null = null;

function loadPlotly(): Promise<Plotly> {
  // @ts-expect-error - plotly.js-dist-min ships no types: only react() is used
  plotly ??= import('plotly.js-dist-min')
    .then(module => (module.default ?? module) as Plotly)
    .catch(error => {
      plotly = null; // asked again at the next refresh
      throw error;
    });
  return plotly;
}

/** The curves section: one chart per metric, kept across refreshes. */
export class CurvesSection {
  readonly node: HTMLElement;
  private readonly charts = new Map<string, HTMLElement>();

  constructor() {
    this.node = document.createElement('div');
    this.node.className = 'hvd-curves';
  }

  show(curves: Traces | undefined): void {
    const metrics = Object.keys(curves ?? {});
    this.node.hidden = metrics.length === 0;
    if (!metrics.length) {
      return;
    }
    loadPlotly()
      .then(Plotly => {
        for (const metric of metrics) {
          Plotly.react(this.chart(metric), curves![metric], layout(metric), { displaylogo: false, responsive: true });
        }
      })
      .catch(error => {
        this.charts.clear();
        this.node.textContent = `the curves could not be drawn: ${error.message || error}`;
      });
  }

  /** The charts purged (plotly's resize listeners go with them). */
  dispose(): void {
    if (plotly !== null) {
      const charts = [...this.charts.values()];
      plotly.then(Plotly => charts.forEach(chart => Plotly.purge(chart))).catch(() => undefined);
    }
    this.charts.clear();
  }

  private chart(metric: string): HTMLElement {
    let chart = this.charts.get(metric);
    if (!chart) {
      const title = document.createElement('b');
      title.textContent = metric;
      chart = document.createElement('div');
      chart.className = 'hvd-curve';
      chart.dataset.metric = metric;
      this.node.append(title, chart);
      this.charts.set(metric, chart);
    }
    return chart;
  }
}
