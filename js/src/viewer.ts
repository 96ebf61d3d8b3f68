// The Horovod Timeline viewer: an anywidget front end drawing on a canvas.
// Rows are tensors, coloured spans are activities; wheel zooms around the cursor, dragging pans,
// shift+wheel scrolls rows, hovering shows a span's details, the toolbar filters.
import { hitTest, layoutRow, maxDurations, pan, rowOffsets, zoom, type Spans, type View } from "./layout";
import { Listeners, type EventTargetLike } from "./listeners";

export interface Model {
  get(name: string): any;
  on(event: string, callback: () => void): void;
  off(event: string, callback: () => void): void;
}

const ROW_HEIGHT = 18;
const DEPTH_HEIGHT = 6;
const LABEL_WIDTH = 180;
const MAX_VISIBLE_ROWS = 30;
const PALETTE = ["#1e88e5", "#43a047", "#fb8c00", "#8e24aa", "#e53935", "#00acc1", "#6d4c41", "#c0ca33", "#5e35b1", "#d81b60"];

/** The model's columns, decoded once per render. */
export interface Timeline {
  rowNames: string[];
  activityNames: string[];
  spans: Spans;
  cycles: Float64Array;
  bounds: [number, number];
}

interface Toolbar {
  element: HTMLDivElement;
  filter: HTMLInputElement;
  reset: HTMLButtonElement;
  info: HTMLSpanElement;
  kindBoxes: HTMLInputElement[]; // one checkbox per activity, indexed by kind
}

/** Everything a frame, a hit test or an input handler needs. */
interface Viewer {
  el: HTMLElement;
  data: Timeline;
  canvas: HTMLCanvasElement;
  context: CanvasRenderingContext2D;
  tooltip: HTMLDivElement;
  info: HTMLSpanElement;
  visibleKinds: Set<number>;
  shownRows: number[];
  firstRow: number;
  view: View;
  dragging: number | null; // clientX of the last drag position, null when not dragging
}

function typed<T>(kind: { new (buffer: ArrayBuffer): T }, value: DataView | ArrayBuffer | null): T {
  if (!value) return new kind(new ArrayBuffer(0));
  const view = value instanceof DataView ? value : new DataView(value);
  return new kind(view.buffer.slice(view.byteOffset, view.byteOffset + view.byteLength) as ArrayBuffer);
}

function colour(kind: number): string {
  return PALETTE[kind % PALETTE.length];
}

function format(us: number): string {
  if (us >= 1e6) return `${(us / 1e6).toFixed(3)} s`;
  if (us >= 1e3) return `${(us / 1e3).toFixed(2)} ms`;
  return `${us.toFixed(0)} µs`;
}

// --- data -----------------------------------------------------------------------------------

/** Decode the model's binary columns into typed arrays (spans sorted by row, then start). */
export function loadTimeline(model: Model): Timeline {
  const rowNames: string[] = model.get("row_names");
  const durations = typed(Float32Array, model.get("durations"));
  const offsets = rowOffsets(typed(Int32Array, model.get("rows")), rowNames.length);
  return {
    rowNames,
    activityNames: model.get("activity_names"),
    spans: {
      starts: typed(Float64Array, model.get("starts")),
      durations,
      kinds: typed(Uint8Array, model.get("kinds")),
      depths: typed(Uint8Array, model.get("depths")),
      rowOffsets: offsets,
      maxDuration: maxDurations(durations, offsets),
    },
    cycles: typed(Float64Array, model.get("cycles")),
    bounds: [0, Math.max(1, model.get("end_us"))],
  };
}

// --- DOM ------------------------------------------------------------------------------------

/** Tensor filter, "whole run" button, info line and one checkbox per activity. */
function buildToolbar(activityNames: string[]): Toolbar {
  const element = document.createElement("div");
  element.style.cssText = "display:flex;gap:8px;align-items:center;font:12px sans-serif;margin-bottom:4px;flex-wrap:wrap";
  const filter = document.createElement("input");
  filter.placeholder = "filter tensors";
  filter.style.width = "160px";
  const reset = document.createElement("button");
  reset.textContent = "whole run";
  const info = document.createElement("span");
  element.append(filter, reset, info);
  const kindBoxes = activityNames.map((name, kind) => {
    const label = document.createElement("label");
    const box = document.createElement("input");
    box.type = "checkbox";
    box.checked = true;
    label.append(box, ` ${name}`);
    label.style.color = colour(kind);
    element.append(label);
    return box;
  });
  return { element, filter, reset, info, kindBoxes };
}

/** Fill `el` with the toolbar, the canvas and the tooltip; the view starts on the whole run. */
function createViewer(el: HTMLElement, data: Timeline, toolbar: Toolbar): Viewer {
  el.classList.add("hvd-timeline-viewer");
  el.innerHTML = "";
  const canvas = document.createElement("canvas");
  canvas.style.cssText = "display:block;border:1px solid #ddd;cursor:grab";
  const tooltip = document.createElement("div");
  tooltip.style.cssText =
    "position:fixed;pointer-events:none;background:#222;color:#fff;font:11px monospace;padding:3px 6px;border-radius:3px;display:none;z-index:1000";
  el.append(toolbar.element, canvas, tooltip);
  const width = Math.max(400, (el.clientWidth || 900) - 2);
  canvas.width = width;
  const viewer: Viewer = {
    el,
    data,
    canvas,
    context: canvas.getContext("2d")!,
    tooltip,
    info: toolbar.info,
    visibleKinds: new Set(data.activityNames.map((_, i) => i)),
    shownRows: data.rowNames.map((_, i) => i),
    firstRow: 0,
    view: { t0: data.bounds[0], t1: data.bounds[1], width: width - LABEL_WIDTH },
    dragging: null,
  };
  fitCanvasHeight(viewer);
  return viewer;
}

function visibleRowCount(v: Viewer): number {
  return Math.min(v.shownRows.length, MAX_VISIBLE_ROWS);
}

function fitCanvasHeight(v: Viewer): void {
  v.canvas.height = Math.max(1, visibleRowCount(v)) * ROW_HEIGHT + 16;
}

// --- drawing --------------------------------------------------------------------------------

/** Draw one frame and record its time in `data-last-frame-ms` (read by the browser test). */
function drawFrame(v: Viewer): void {
  const frameStart = performance.now();
  v.context.clearRect(0, 0, v.canvas.width, v.canvas.height);
  v.context.font = "11px sans-serif";
  const count = visibleRowCount(v);
  for (let slot = 0; slot < count && v.firstRow + slot < v.shownRows.length; slot++) drawRow(v, slot);
  drawCycleMarks(v, count);
  drawAxis(v, count);
  const span = format(v.view.t1 - v.view.t0);
  v.info.textContent = `${v.shownRows.length} tensors, rows ${v.firstRow + 1}–${v.firstRow + count}, window ${span}`;
  v.el.dataset.lastFrameMs = (performance.now() - frameStart).toFixed(2);
}

/** The row in visible slot `slot`: striped background, tensor name, its marks. */
function drawRow(v: Viewer, slot: number): void {
  const { context, canvas } = v;
  const row = v.shownRows[v.firstRow + slot];
  const y = slot * ROW_HEIGHT;
  context.fillStyle = slot % 2 ? "#fafafa" : "#fff";
  context.fillRect(0, y, canvas.width, ROW_HEIGHT);
  context.fillStyle = "#333";
  context.fillText(v.data.rowNames[row].slice(0, 28), 4, y + 13);
  for (const mark of layoutRow(v.data.spans, row, v.view, v.visibleKinds)) {
    const x0 = Math.max(LABEL_WIDTH, LABEL_WIDTH + mark.x);
    const x1 = Math.min(canvas.width, LABEL_WIDTH + mark.x + mark.w);
    if (x1 <= x0) continue;
    context.fillStyle = colour(mark.kind);
    context.globalAlpha = mark.count > 1 ? 0.6 : 1;
    context.fillRect(x0, y + 1 + mark.depth * DEPTH_HEIGHT, Math.max(1, x1 - x0), ROW_HEIGHT - 2 - mark.depth * DEPTH_HEIGHT);
  }
  context.globalAlpha = 1;
}

/** A vertical line at each CYCLE_START inside the window. */
function drawCycleMarks(v: Viewer, count: number): void {
  const { context, view, data } = v;
  context.strokeStyle = "rgba(0,0,0,0.25)";
  const scale = view.width / (view.t1 - view.t0);
  for (let i = 0; i < data.cycles.length; i++) {
    if (data.cycles[i] < view.t0 || data.cycles[i] > view.t1) continue;
    const x = LABEL_WIDTH + (data.cycles[i] - view.t0) * scale;
    context.beginPath();
    context.moveTo(x, 0);
    context.lineTo(x, count * ROW_HEIGHT);
    context.stroke();
  }
}

/** The window's start and end times under the rows. */
function drawAxis(v: Viewer, count: number): void {
  const { context, canvas, view } = v;
  context.fillStyle = "#333";
  const axisY = count * ROW_HEIGHT + 12;
  context.fillText(format(view.t0), LABEL_WIDTH, axisY);
  const right = format(view.t1);
  context.fillText(right, canvas.width - context.measureText(right).width - 2, axisY);
}

// --- hit testing and tooltip ----------------------------------------------------------------

/** The span under canvas point (offsetX, offsetY), deepest first, or null. */
function spanAt(v: Viewer, offsetX: number, offsetY: number): { row: number; index: number } | null {
  const slot = Math.floor(offsetY / ROW_HEIGHT);
  const row = v.shownRows[v.firstRow + slot];
  const depth = Math.max(0, Math.floor((offsetY - slot * ROW_HEIGHT - 1) / DEPTH_HEIGHT));
  const x = offsetX - LABEL_WIDTH;
  if (row === undefined || x < 0) return null;
  let index = -1;
  for (let d = depth; d >= 0 && index < 0; d--) index = hitTest(v.data.spans, row, v.view, x, d);
  return index < 0 ? null : { row, index };
}

function showTooltip(v: Viewer, event: MouseEvent): void {
  const hit = spanAt(v, event.offsetX, event.offsetY);
  if (!hit) return hideTooltip(v);
  const { spans, activityNames, rowNames } = v.data;
  const { row, index } = hit;
  v.tooltip.textContent = `${activityNames[spans.kinds[index]]} · ${rowNames[row]} · at ${format(spans.starts[index])} · ${format(spans.durations[index])}`;
  v.tooltip.style.left = `${event.clientX + 12}px`;
  v.tooltip.style.top = `${event.clientY + 12}px`;
  v.tooltip.style.display = "block";
}

function hideTooltip(v: Viewer): void {
  v.tooltip.style.display = "none";
}

// --- input ----------------------------------------------------------------------------------

/** Wheel zooms around the cursor; shift+wheel scrolls rows by one. */
function onWheel(v: Viewer, event: WheelEvent): void {
  event.preventDefault();
  if (event.shiftKey) {
    const last = v.shownRows.length - visibleRowCount(v);
    v.firstRow = Math.max(0, Math.min(last, v.firstRow + Math.sign(event.deltaY || event.deltaX)));
  } else {
    v.view = zoom(v.view, event.offsetX - LABEL_WIDTH, event.deltaY < 0 ? 0.8 : 1.25, v.data.bounds);
  }
  drawFrame(v);
}

/** While dragging, pan; otherwise show what is under the cursor. */
function onMouseMove(v: Viewer, event: MouseEvent): void {
  if (v.dragging === null) return showTooltip(v, event);
  v.view = pan(v.view, event.clientX - v.dragging, v.data.bounds);
  v.dragging = event.clientX;
  drawFrame(v);
}

function applyFilter(v: Viewer, text: string): void {
  const needle = text.toLowerCase();
  v.shownRows = v.data.rowNames.map((_, i) => i).filter((i) => v.data.rowNames[i].toLowerCase().includes(needle));
  v.firstRow = 0;
  fitCanvasHeight(v);
  drawFrame(v);
}

function showKind(v: Viewer, kind: number, shown: boolean): void {
  if (shown) v.visibleKinds.add(kind);
  else v.visibleKinds.delete(kind);
  drawFrame(v);
}

function showWholeRun(v: Viewer): void {
  v.view = { t0: v.data.bounds[0], t1: v.data.bounds[1], width: v.view.width };
  drawFrame(v);
}

/** Canvas input; the drag ends on a mouseup anywhere, so that one goes on `host` (the window). */
function bindCanvas(v: Viewer, listeners: Listeners, host: EventTargetLike): void {
  listeners.on<WheelEvent>(v.canvas, "wheel", (event) => onWheel(v, event));
  listeners.on<MouseEvent>(v.canvas, "mousedown", (event) => (v.dragging = event.clientX));
  listeners.on(host, "mouseup", () => (v.dragging = null));
  listeners.on<MouseEvent>(v.canvas, "mousemove", (event) => onMouseMove(v, event));
  listeners.on(v.canvas, "mouseleave", () => hideTooltip(v));
}

function bindToolbar(v: Viewer, toolbar: Toolbar, listeners: Listeners): void {
  listeners.on(toolbar.filter, "input", () => applyFilter(v, toolbar.filter.value));
  listeners.on(toolbar.reset, "click", () => showWholeRun(v));
  toolbar.kindBoxes.forEach((box, kind) => listeners.on(box, "change", () => showKind(v, kind, box.checked)));
}

// --- entry point ----------------------------------------------------------------------------

/**
 * anywidget's render: draw the model into `el`, record `data-first-paint-ms`, and return the
 * cleanup anywidget calls when the view goes away, which removes every listener render added
 * (including the one on `host`, the window) and the tooltip.
 */
export function render({ model, el }: { model: Model; el: HTMLElement }, host: EventTargetLike = window): () => void {
  const started = performance.now();
  const data = loadTimeline(model);
  const toolbar = buildToolbar(data.activityNames);
  const viewer = createViewer(el, data, toolbar);
  const listeners = new Listeners();
  bindCanvas(viewer, listeners, host);
  bindToolbar(viewer, toolbar, listeners);
  drawFrame(viewer);
  el.dataset.firstPaintMs = (performance.now() - started).toFixed(1);
  return () => {
    listeners.dispose();
    viewer.tooltip.remove();
  };
}

export default { render };
