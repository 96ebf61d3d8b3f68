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
 * The marks to draw for one row. Spans at least a pixel wide are drawn as they are; narrower
 * ones that fall on the same pixel and depth merge into one 1-pixel mark, so the work per frame
 * is bounded by the pixels, not by the events (millions of spans stay smooth). A mark the kernel
 * already aggregated counts as the spans it stands for, so it is drawn as a merged mark too.
 */
export function layoutRow(spans: Spans, row: number, view: View, visibleKinds?: Set<number>): Mark[] {
  const scale = view.width / (view.t1 - view.t0);
  const lo = lowerBound(spans.starts, spans.rowOffsets[row], spans.rowOffsets[row + 1], view.t0 - spans.maxDuration[row]);
  const hi = lowerBound(spans.starts, lo, spans.rowOffsets[row + 1], view.t1);
  const marks: Mark[] = [];
  const lastTiny = new Map<number, Mark>(); // depth -> the 1-pixel mark being filled
  for (let i = lo; i < hi; i++) {
    if (visibleKinds && !visibleKinds.has(spans.kinds[i])) continue;
    const end = spans.starts[i] + spans.durations[i];
    if (end < view.t0) continue;
    const x = (spans.starts[i] - view.t0) * scale;
    const w = spans.durations[i] * scale;
    const depth = spans.depths[i];
    const count = spanCount(spans, i);
    if (w >= 1) {
      marks.push({ x, w, depth, kind: spans.kinds[i], count, index: i });
      continue;
    }
    const pixel = Math.floor(x);
    const open = lastTiny.get(depth);
    if (open && open.x === pixel) {
      open.count += count;
    } else {
      const mark = { x: pixel, w: 1, depth, kind: spans.kinds[i], count, index: i };
      lastTiny.set(depth, mark);
      marks.push(mark);
    }
  }
  return marks;
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
