// The server extension's API (hvd_magic.server.handlers), through JupyterLab's own connection
// settings: its token or login cookie, its XSRF header, its base URL.

import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { Overview, RunRow } from './runs';
import type { TimelineAnswer, WindowAnswer } from './timeline';

export async function request(path: string, init: RequestInit = {}): Promise<any> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, 'hvd-magic', path);
  const response = await ServerConnection.makeRequest(url, init, settings);
  const text = await response.text();
  let data: any = {};
  try {
    data = text ? JSON.parse(text) : {};
  } catch {
    data = { message: text };
  }
  if (!response.ok) {
    throw new Error(data.message || data.reason || response.statusText);
  }
  return data;
}

export function getRun(id: string, perRank: boolean): Promise<RunRow> {
  return request(`runs/${id}?per_rank=${perRank ? 1 : 0}`);
}

export function stop(id: string, atOnce: boolean): Promise<{ asked: string }> {
  return request(`runs/${id}/stop`, { method: 'POST', body: JSON.stringify({ at_once: atOnce }) });
}

export function stacks(id: string): Promise<{ stacks: string }> {
  return request(`runs/${id}/stacks`, { method: 'POST', body: '{}' });
}

/**
 * The runs and sessions as the server streams them (the websocket /hvd-magic/updates, once a second); while
 * the socket is down, GET /hvd-magic/runs once a second, and the socket tried again.
 */
export class RunList {
  private socket: WebSocket | null = null;
  private timer: ReturnType<typeof setTimeout> | null = null;
  private disposed = false;

  constructor(private readonly onRuns: (overview: Overview) => void) {
    this.connect();
  }

  private connect(): void {
    if (this.disposed) {
      return;
    }
    const settings = ServerConnection.makeSettings();
    let url = URLExt.join(settings.wsUrl, 'hvd-magic', 'updates');
    if (settings.token) {
      url += `?token=${encodeURIComponent(settings.token)}`;
    }
    const socket = new settings.WebSocket(url);
    socket.onmessage = event => this.onRuns(JSON.parse(event.data));
    socket.onclose = () => {
      this.socket = null;
      this.poll();
    };
    this.socket = socket;
  }

  private poll(): void {
    if (this.disposed) {
      return;
    }
    request('runs')
      .then(data => this.onRuns(data))
      .catch(() => undefined)
      .finally(() => {
        this.timer = setTimeout(() => this.connect(), 1000);
      });
  }

  dispose(): void {
    this.disposed = true;
    if (this.timer !== null) {
      clearTimeout(this.timer);
    }
    this.socket?.close();
  }
}

export function getTimeline(id: string, version: number): Promise<TimelineAnswer> {
  return request(`runs/${id}/timeline?version=${version}`);
}

export function askWindow(id: string, content: object): Promise<WindowAnswer> {
  return request(`runs/${id}/timeline`, { method: 'POST', body: JSON.stringify({ window: content }) });
}
