// A minimal stand-in for the DOM (no jsdom/happy-dom here): just what the viewer touches, with
// listener bookkeeping so tests can count what is still subscribed.

type Listener = (event: any) => void;

export class FakeTarget {
  readonly listeners = new Map<string, Listener[]>();
  [handler: `on${string}`]: Listener | undefined;

  addEventListener(type: string, listener: Listener): void {
    const list = this.listeners.get(type) ?? [];
    if (!list.includes(listener)) list.push(listener);
    this.listeners.set(type, list);
  }

  removeEventListener(type: string, listener: Listener): void {
    const list = this.listeners.get(type) ?? [];
    const at = list.indexOf(listener);
    if (at >= 0) list.splice(at, 1);
  }

  /** Live listeners, over all types or one. */
  count(type?: string): number {
    if (type !== undefined) return this.listeners.get(type)?.length ?? 0;
    let n = 0;
    for (const list of this.listeners.values()) n += list.length;
    return n;
  }

  /** Call the listeners of `type` (and an `on<type>` property, as the DOM does). */
  dispatch(type: string, fields: Record<string, unknown> = {}): void {
    const event = { type, preventDefault() {}, ...fields };
    for (const listener of [...(this.listeners.get(type) ?? [])]) listener(event);
    this[`on${type}`]?.(event);
  }
}

export interface Drawn {
  op: string;
  args: unknown[];
  fillStyle: string;
  alpha: number;
}

/** A 2D context recording the calls of the last frame (cleared by clearRect). */
export function fakeContext() {
  const frame: Drawn[] = [];
  const context: Record<string, any> = { frame, fillStyle: "", strokeStyle: "", globalAlpha: 1, font: "" };
  for (const op of ["fillRect", "fillText", "beginPath", "moveTo", "lineTo", "stroke"]) {
    context[op] = (...args: unknown[]) => frame.push({ op, args, fillStyle: context.fillStyle, alpha: context.globalAlpha });
  }
  context.clearRect = () => frame.splice(0);
  context.measureText = (text: string) => ({ width: text.length * 6 });
  return context as Record<string, any> & { frame: Drawn[] };
}

export class FakeElement extends FakeTarget {
  readonly style: Record<string, string> = { cssText: "" };
  readonly dataset: Record<string, string> = {};
  readonly classes = new Set<string>();
  readonly classList = { add: (...names: string[]) => names.forEach((n) => this.classes.add(n)) };
  children: Array<FakeElement | string> = [];
  parent: FakeElement | null = null;
  textContent = "";
  placeholder = "";
  value = "";
  type = "";
  checked = false;
  width = 0;
  height = 0;
  clientWidth = 0;
  private context?: ReturnType<typeof fakeContext>;

  constructor(readonly tagName: string) {
    super();
  }

  set innerHTML(_html: string) {
    this.children = [];
  }

  append(...nodes: Array<FakeElement | string>): void {
    for (const node of nodes) {
      if (typeof node !== "string") node.parent = this;
      this.children.push(node);
    }
  }

  remove(): void {
    if (this.parent) this.parent.children = this.parent.children.filter((c) => c !== this);
    this.parent = null;
  }

  getContext(_kind: string) {
    return (this.context ??= fakeContext());
  }

  /** Descendants with this tag name, in document order. */
  all(tagName: string): FakeElement[] {
    const found: FakeElement[] = [];
    for (const child of this.children) {
      if (typeof child === "string") continue;
      if (child.tagName === tagName) found.push(child);
      found.push(...child.all(tagName));
    }
    return found;
  }

  /** Every listener on this element and its descendants. */
  countTree(): number {
    return this.children.reduce((n, c) => n + (typeof c === "string" ? 0 : c.countTree()), this.count());
  }
}

export class FakeDocument extends FakeTarget {
  createElement(tagName: string): FakeElement {
    return new FakeElement(tagName);
  }
}

/** Bytes traitlets arrive in the browser as DataViews. */
export function bytes(array: ArrayBufferView): DataView {
  return new DataView(array.buffer, array.byteOffset, array.byteLength);
}

/**
 * A model like the Python TimelineViewer's: `rowCount` tensors "layer0"…, each with a long
 * ALLREDUCE span [0, 400) at depth 0 and a QUEUE span [100, 150) at depth 1; cycles at 0 and
 * 500 µs; the run ends at 1000 µs. `traits` overrides or adds traits (e.g. `lod`, `counts`).
 * Counts its live on() subscriptions, records what the front end send()s, and lets a test
 * play the kernel: `emit("msg:custom", content, buffers)` or `set(name, value)`.
 */
export function fakeModel(rowCount = 40, traits: Record<string, unknown> = {}) {
  const rows: number[] = [];
  const starts: number[] = [];
  for (let r = 0; r < rowCount; r++) rows.push(r, r), starts.push(0, 100);
  const values: Record<string, unknown> = {
    row_names: Array.from({ length: rowCount }, (_, r) => `layer${r}`),
    activity_names: ["ALLREDUCE", "QUEUE"],
    rows: bytes(Int32Array.from(rows)),
    starts: bytes(Float64Array.from(starts)),
    durations: bytes(Float32Array.from(rows.map((_, i) => (i % 2 ? 50 : 400)))),
    kinds: bytes(Uint16Array.from(rows.map((_, i) => i % 2))),
    depths: bytes(Uint8Array.from(rows.map((_, i) => i % 2))),
    counts: bytes(new Uint32Array(0)),
    cycles: bytes(Float64Array.from([0, 500])),
    end_us: 1000,
    lod: false,
    ...traits,
  };
  const subscriptions = new FakeTarget();
  const sent: any[] = [];
  /** Call the model's subscribers of `event` with these arguments, as Backbone's trigger does. */
  const emit = (event: string, ...args: unknown[]) => {
    for (const callback of [...(subscriptions.listeners.get(event) ?? [])]) (callback as (...a: unknown[]) => void)(...args);
  };
  return {
    get: (name: string) => values[name],
    on: (event: string, callback: (...args: any[]) => void) => subscriptions.addEventListener(event, callback),
    off: (event: string, callback: (...args: any[]) => void) => subscriptions.removeEventListener(event, callback),
    send: (content: object) => sent.push(content),
    subscriptions,
    sent,
    emit,
    /** Set traits at once, then fire their change events (as a kernel update does). */
    set(changes: Record<string, unknown>) {
      Object.assign(values, changes);
      for (const name of Object.keys(changes)) emit(`change:${name}`);
    },
  };
}

/** A mark of a kernel reply or overview. */
export interface FakeMark {
  row: number;
  start: number;
  duration: number;
  kind?: number;
  depth?: number;
  count?: number;
}

/**
 * A "spans" reply's extra fields and its six buffers (DataViews, as anywidget delivers them) for
 * these marks of `rows`, as the kernel packs them: starts after a base in 32 bits, marks per row.
 */
export function spanReply(marks: FakeMark[], rows: number[]): { fields: { base: number; start_bits: number }; buffers: DataView[] } {
  const sorted = [...marks].sort((a, b) => a.row - b.row || a.start - b.start);
  const base = sorted.length ? Math.min(...sorted.map((m) => m.start)) : 0;
  return {
    fields: { base, start_bits: 32 },
    buffers: [
      bytes(Uint32Array.from(sorted.map((m) => m.start - base))),
      bytes(Float32Array.from(sorted.map((m) => m.duration))),
      bytes(Int32Array.from(rows.map((row) => sorted.filter((m) => m.row === row).length))),
      bytes(Uint16Array.from(sorted.map((m) => m.kind ?? 0))),
      bytes(Uint8Array.from(sorted.map((m) => m.depth ?? 0))),
      bytes(Uint32Array.from(sorted.map((m) => m.count ?? 1))),
    ],
  };
}
