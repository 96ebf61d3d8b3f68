// A run's Horovod Timeline in its tab, drawn by the notebook's own viewer (js/src/viewer.ts, the
// same code the anywidget under a cell runs): a model that holds what the kernel's endpoint sent
// through the server, instead of a widget's synced traits, and sends the viewer's window requests
// to the kernel the same way.

import { render, type Model } from '../../js/src/viewer';

/** What GET /hvd-magic/runs/ID/timeline answers: the traits when newer than the version asked. */
export interface TimelineAnswer {
  version: number;
  said: string;
  traits?: Record<string, unknown>;
  binary?: string[]; // the traits that are binary columns, as base64
}

/** The kernel's reply to a window request: its content and binary columns (base64). */
export interface WindowAnswer {
  reply: object;
  buffers: string[];
}

type Callback = (...args: any[]) => void;

/** Bytes from base64, as the anywidget model hands a binary trait over: a DataView. */
export function decode(text: string): DataView {
  const bytes = Uint8Array.from(atob(text), c => c.charCodeAt(0));
  return new DataView(bytes.buffer);
}

/** The viewer's model, fed by `update` with what the kernel sent; `send` asks for a window. */
export class TimelineModel implements Model {
  private readonly values = new Map<string, unknown>();
  private readonly callbacks = new Map<string, Set<Callback>>();

  constructor(private readonly askWindow: (content: object) => Promise<WindowAnswer>) {}

  get(name: string): any {
    return this.values.get(name);
  }

  on(event: string, callback: Callback): void {
    if (!this.callbacks.has(event)) {
      this.callbacks.set(event, new Set());
    }
    this.callbacks.get(event)!.add(callback);
  }

  off(event: string, callback: Callback): void {
    this.callbacks.get(event)?.delete(callback);
  }

  private emit(event: string, ...args: unknown[]): void {
    for (const callback of [...(this.callbacks.get(event) ?? [])]) {
      callback(...args);
    }
  }

  /** New traits: every value set first, then their change events (one reload of the viewer). */
  update(answer: TimelineAnswer): void {
    const binary = new Set(answer.binary ?? []);
    const names = Object.keys(answer.traits ?? {});
    for (const name of names) {
      const value = answer.traits![name];
      this.values.set(name, binary.has(name) ? decode(value as string) : value);
    }
    for (const name of names) {
      this.emit(`change:${name}`);
    }
  }

  send(content: object): void {
    this.askWindow(content)
      .then(answer => this.emit('msg:custom', answer.reply, answer.buffers.map(decode)))
      .catch(() => undefined); // the viewer asks again when its request is taken as lost
  }
}

/**
 * The timeline part of a run's tab: asks for the timeline (`ask(version)`: the traits only when
 * newer than the version shown) each time `refresh` is called, and draws it once there is one.
 */
export class TimelineSection {
  readonly node: HTMLElement;
  private readonly said: HTMLElement;
  private readonly canvas: HTMLElement;
  private readonly model: TimelineModel;
  private version = -1;
  private asking = false;
  private again = false; // asked to refresh while asking: once more, so the last state is shown
  private cleanup: (() => void) | null = null;
  private disposed = false;

  constructor(
    private readonly ask: (version: number) => Promise<TimelineAnswer>,
    askWindow: (content: object) => Promise<WindowAnswer>
  ) {
    this.model = new TimelineModel(askWindow);
    this.node = document.createElement('div');
    this.node.className = 'hvd-timeline-section';
    const title = document.createElement('h3');
    title.textContent = 'Horovod Timeline';
    this.said = document.createElement('div');
    this.said.className = 'hvd-timeline-said';
    this.canvas = document.createElement('div');
    this.node.append(title, this.said, this.canvas);
  }

  refresh(): void {
    if (this.disposed) {
      return;
    }
    if (this.asking) {
      this.again = true; // a large file's first reading may take longer than the tab's pace
      return;
    }
    this.asking = true;
    this.ask(this.version)
      .then(answer => {
        this.said.textContent = answer.said;
        if (answer.traits && answer.version !== this.version) {
          this.version = answer.version;
          this.model.update(answer);
          if (this.cleanup === null && !this.disposed) {
            this.cleanup = render({ model: this.model, el: this.canvas });
          }
        }
      })
      .catch(error => {
        this.said.textContent = String(error.message || error);
      })
      .finally(() => {
        this.asking = false;
        if (this.again) {
          this.again = false;
          this.refresh();
        }
      });
  }

  dispose(): void {
    this.disposed = true;
    this.cleanup?.();
    this.cleanup = null;
  }
}
