// hvd_magic's JupyterLab extension: the Horovod side panel, a tab per run, a status-bar count.

import { ILabShell, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { MainAreaWidget } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { RunList } from './api';
import { CellBanners } from './cells';
import { RunsPanel, RunView } from './panel';
import { RunRow, statusText } from './runs';

const icon = new LabIcon({
  name: 'hvd-magic:horovod',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><g class="jp-icon3" fill="#616161">' +
    '<rect x="3" y="12" width="4" height="9"/><rect x="10" y="7" width="4" height="14"/>' +
    '<rect x="17" y="3" width="4" height="18"/></g></svg>'
});

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'hvd-magic-labextension:plugin',
  description: 'The Horovod panel: every live and finished run of this server\'s kernels.',
  autoStart: true,
  requires: [ILabShell],
  optional: [IStatusBar, INotebookTracker],
  activate: (
    app: JupyterFrontEnd,
    shell: ILabShell,
    statusBar: IStatusBar | null,
    notebooks: INotebookTracker | null
  ) => {
    const views = new Map<string, MainAreaWidget<RunView>>();
    const openNotebook = (path: string) => app.commands.execute('docmanager:open', { path });
    const openRun = (run: RunRow) => {
      let view = views.get(run.id);
      if (!view || view.isDisposed) {
        const content = new RunView(run, openNotebook);
        view = new MainAreaWidget({ content });
        view.id = `hvd-magic-tab-${run.id.replace('/', '-')}`;
        view.title.label = content.title.label; // the notebook's name and the run's number
        view.title.caption = content.title.caption;
        view.title.icon = icon;
        views.set(run.id, view);
        shell.add(view, 'main');
      }
      shell.activateById(view.id);
    };
    const panel = new RunsPanel(openRun);
    panel.title.icon = icon;
    shell.add(panel, 'left', { rank: 600 });

    const status = new Widget();
    status.addClass('hvd-status');
    status.node.textContent = 'Horovod: 0 live';
    status.node.onclick = () => shell.activateById(panel.id);
    if (statusBar) {
      statusBar.registerStatusItem('hvd-magic:live-runs', { item: status, align: 'left', rank: 50 });
    }
    const banners = notebooks ? new CellBanners(notebooks, openRun) : null;
    new RunList(overview => {
      panel.showOverview(overview);
      status.node.textContent = statusText(overview);
      banners?.show(overview.runs);
    });
    app.commands.addCommand('hvd-magic:open-panel', {
      label: 'Show the Horovod runs',
      execute: () => shell.activateById(panel.id)
    });
  }
};

export default plugin;
