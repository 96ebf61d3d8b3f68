// Pure layout logic of the timeline viewer: which spans are visible, where they go, and how
// spans narrower than a pixel merge into one mark (level of detail). No DOM here.

export interface Spans {
  starts: Float64Array; // microseconds from the timeline's start, sorted within each row
  durations: Float32Array; // microseconds
  kinds: Uint16Array; // index into the activity names (up to 65,536 of them)
  depths: Uint8Array; // nesting level inside the row (0 = top-level activity)
  rowOffsets: Int32Array; // spans of row r are [rowOffsets[r], rowOffsets[r + 1])
  maxDuration: Float32Array; // longest span of each row: how far back a visible span can start
  // Spans the kernel merged into each mark (its level of detail for big timelines); absent when
  // every mark is one real span.
  counts?: Uint32Array;
}

export interface View {
  t0: number; // microseconds at the left edge
  t1: number; // microseconds at the right edge
  width: number; // pixels
}

export interface Mark {
  x: number;
  w: number;
  depth: number;
  kind: number;
  count: number; // spans merged into this mark (1 = a real span)
  index: number; // first span of the mark
}

export const MIN_WINDOW_US = 10;

/** Start index of each row in spans sorted by (row, start); length rows + 1. */
export function rowOffsets(rows: Int32Array, rowCount: number): Int32Array {
  const offsets = new Int32Array(rowCount + 1);
  for (let i = 0; i < rows.length; i++) offsets[rows[i] + 1]++;
  for (let r = 0; r < rowCount; r++) offsets[r + 1] += offsets[r];
  return offsets;
}

/** Longest span of each row. */
export function maxDurations(durations: Float32Array, offsets: Int32Array): Float32Array {
  const out = new Float32Array(offsets.length - 1);
  for (let r = 0; r < out.length; r++) {
    let longest = 0;
    for (let i = offsets[r]; i < offsets[r + 1]; i++) if (durations[i] > longest) longest = durations[i];
    out[r] = longest;
  }
  return out;
}

/** First index in [lo, hi) whose value is >= x. */
export function lowerBound(values: Float64Array, lo: number, hi: number, x: number): number {
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (values[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/** How many real spans mark ``i`` stands for (> 1 when the kernel aggregated them). */
export function spanCount(spans: Spans, i: number): number {
  return Math.max(1, spans.counts?.[i] ?? 1);
}

/**
 * Marks in reusable columns, one entry a mark: what a frame lays out and draws without an object
 * a mark (the first frames run before the engine has compiled the loop, where every allocation
 * shows).
 */
export class MarkColumns {
  length = 0;
  x = new Float64Array(256);
  w = new Float64Array(256);
  depth = new Uint8Array(256);
  kind = new Uint32Array(256);
  count = new Float64Array(256);
  index = new Int32Array(256);
  private open = new Int32Array(256); // per depth: the 1-pixel mark being filled (-1: none)

  /** Empty, with room for `n` marks. */
  reset(n: number): void {
    this.length = 0;
    this.open.fill(-1);
    if (n <= this.x.length) return;
    const size = Math.max(n, 2 * this.x.length);
    this.x = new Float64Array(size);
    this.w = new Float64Array(size);
    this.depth = new Uint8Array(size);
    this.kind = new Uint32Array(size);
    this.count = new Float64Array(size);
    this.index = new Int32Array(size);
  }

  /** Counts span `i` (of `count` spans) into a 1-pixel mark at `pixel`, or adds one. */
  addTiny(pixel: number, depth: number, kind: number, count: number, i: number): void {
    const open = this.open[depth];
    if (open >= 0 && this.x[open] === pixel) this.count[open] += count;
    else this.open[depth] = this.add(pixel, 1, depth, kind, count, i);
  }

  add(x: number, w: number, depth: number, kind: number, count: number, i: number): number {
    const at = this.length++;
    this.x[at] = x;
    this.w[at] = w;
    this.depth[at] = depth;
    this.kind[at] = kind;
    this.count[at] = count;
    this.index[at] = i;
    return at;
  }
}

/**
 * The marks to draw for one row, into `out`. Spans at least a pixel wide are drawn as they are;
 * narrower ones that fall on the same pixel and depth merge into one 1-pixel mark, so the work
 * per frame is bounded by the pixels, not by the events (millions of spans stay smooth). A mark
 * the kernel already aggregated counts as the spans it stands for, so it is drawn as a merged
 * mark too.
 */
export function layoutRowInto(spans: Spans, row: number, view: View, out: MarkColumns, visibleKinds?: Set<number>): void {
  const scale = view.width / (view.t1 - view.t0);
  const lo = lowerBound(spans.starts, spans.rowOffsets[row], spans.rowOffsets[row + 1], view.t0 - spans.maxDuration[row]);
  const hi = lowerBound(spans.starts, lo, spans.rowOffsets[row + 1], view.t1);
  out.reset(hi - lo);
  const { starts, durations, depths, kinds, counts } = spans;
  for (let i = lo; i < hi; i++) {
    if (visibleKinds && !visibleKinds.has(kinds[i])) continue;
    if (starts[i] + durations[i] < view.t0) continue;
    const x = (starts[i] - view.t0) * scale;
    const w = durations[i] * scale;
    const count = counts ? Math.max(1, counts[i]) : 1;
    if (w >= 1) out.add(x, w, depths[i], kinds[i], count, i);
    else out.addTiny(Math.floor(x), depths[i], kinds[i], count, i);
  }
}

/** The marks of one row as objects (see layoutRowInto). */
export function layoutRow(spans: Spans, row: number, view: View, visibleKinds?: Set<number>): Mark[] {
  const out = new MarkColumns();
  layoutRowInto(spans, row, view, out, visibleKinds);
  return Array.from({ length: out.length }, (_, i) => ({
    x: out.x[i],
    w: out.w[i],
    depth: out.depth[i],
    kind: out.kind[i],
    count: out.count[i],
    index: out.index[i],
  }));
}

/**
 * The pixels (0 .. width - 1, ascending) of the view where marks sorted in time (cycle starts)
 * fall, each once: jumps over the rest of a pixel's marks, so a frame costs its pixels, not the
 * marks in the window.
 */
export function cyclePixels(marks: Float64Array, view: View): number[] {
  const scale = view.width / (view.t1 - view.t0);
  const pixels: number[] = [];
  let i = lowerBound(marks, 0, marks.length, view.t0);
  while (i < marks.length && marks[i] <= view.t1) {
    const x = Math.min(view.width - 1, Math.floor((marks[i] - view.t0) * scale));
    if (pixels[pixels.length - 1] !== x) pixels.push(x); // (rounding may land a mark on the pixel before)
    i = lowerBound(marks, i + 1, marks.length, view.t0 + (x + 1) / scale);
  }
  return pixels;
}

/** Zoom by ``factor`` (< 1 zooms in) keeping the time under pixel ``anchorX`` in place. */
export function zoom(view: View, anchorX: number, factor: number, bounds: [number, number]): View {
  const anchor = view.t0 + ((view.t1 - view.t0) * anchorX) / view.width;
  let span = Math.max(MIN_WINDOW_US, (view.t1 - view.t0) * factor);
  span = Math.min(span, bounds[1] - bounds[0]);
  const t0 = anchor - ((anchor - view.t0) * span) / (view.t1 - view.t0);
  return clamp({ t0, t1: t0 + span, width: view.width }, bounds);
}

/** Move the window by ``dx`` pixels (positive: towards earlier times, as when dragging right). */
export function pan(view: View, dx: number, bounds: [number, number]): View {
  const shift = (-dx * (view.t1 - view.t0)) / view.width;
  return clamp({ t0: view.t0 + shift, t1: view.t1 + shift, width: view.width }, bounds);
}

function clamp(view: View, bounds: [number, number]): View {
  const span = view.t1 - view.t0;
  let t0 = Math.max(bounds[0], Math.min(view.t0, bounds[1] - span));
  if (span >= bounds[1] - bounds[0]) t0 = bounds[0];
  return { t0, t1: t0 + span, width: view.width };
}

/** The span under pixel x in a row (deepest first), or -1. */
export function hitTest(spans: Spans, row: number, view: View, x: number, depth: number): number {
  const t = view.t0 + ((view.t1 - view.t0) * x) / view.width;
  const slack = (view.t1 - view.t0) / view.width; // one pixel, so thin spans can be hovered
  const lo = lowerBound(spans.starts, spans.rowOffsets[row], spans.rowOffsets[row + 1], t - spans.maxDuration[row] - slack);
  const hi = lowerBound(spans.starts, lo, spans.rowOffsets[row + 1], t + slack);
  for (let i = hi - 1; i >= lo; i--) {
    if (spans.depths[i] === depth && spans.starts[i] - slack <= t && t <= spans.starts[i] + spans.durations[i] + slack) return i;
  }
  return -1;
}

// --- kernel-served detail -------------------------------------------------------------------

/** The kernel's reply for a window: finer marks of some rows, valid while the view is inside. */
export interface Detail {
  spans: Spans; // row offsets span every row of the timeline; rows not in ``rows`` are empty
  rows: Set<number>;
  t0: number;
  t1: number;
}

/**
 * Which layer to draw (and hit-test) a row from: the detail if it has that row and covers the
 * whole view, else the overview. A partly covered view would show holes, so it falls back.
 */
export function layerFor(overview: Spans, detail: Detail | null, row: number, view: View): Spans {
  if (detail && detail.rows.has(row) && detail.t0 <= view.t0 && view.t1 <= detail.t1) return detail.spans;
  return overview;
}
