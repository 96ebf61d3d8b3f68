// Listener bookkeeping for the viewer: everything render() subscribes to goes through one
// Listeners scope, so the cleanup function anywidget calls can take all of it back.

/** What addEventListener/removeEventListener need: a DOM EventTarget, `window`, or a test fake. */
export interface EventTargetLike {
  addEventListener(type: string, listener: (event: any) => void): void;
  removeEventListener(type: string, listener: (event: any) => void): void;
}

/** A model callback: change events pass nothing we use, "msg:custom" passes (content, buffers). */
export type ModelCallback = (...args: any[]) => void;

/** What the anywidget model's on/off need. */
export interface EmitterLike {
  on(event: string, callback: ModelCallback): void;
  off(event: string, callback: ModelCallback): void;
}

export class Listeners {
  private readonly removers: Array<() => void> = [];

  /** Add a DOM listener, removed again by dispose(). */
  on<E = Event>(target: EventTargetLike, type: string, listener: (event: E) => void): void {
    target.addEventListener(type, listener);
    this.removers.push(() => target.removeEventListener(type, listener));
  }

  /** Subscribe to a model event, unsubscribed with `.off` by dispose(). */
  onModel(model: EmitterLike, event: string, callback: ModelCallback): void {
    model.on(event, callback);
    this.removers.push(() => model.off(event, callback));
  }

  /** How many subscriptions are live. */
  get size(): number {
    return this.removers.length;
  }

  /** Remove every listener, newest first; safe to call more than once. */
  dispose(): void {
    while (this.removers.length) this.removers.pop()!();
  }
}
