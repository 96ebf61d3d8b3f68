// The Horovod Timeline viewer: an anywidget front end drawing on a canvas.
// Rows are tensors, coloured spans are activities; wheel zooms around the cursor, dragging pans,
// shift+wheel scrolls rows, hovering shows a span's details, the toolbar filters.
// For big timelines (`lod` true) the traits hold only an overview the kernel aggregated, and the
// viewer asks the kernel for the detail of the window it shows (see requestDetail / onReply).
import {
  cyclePixels,
  hitTest,
  layerFor,
  layoutRowInto,
  MarkColumns,
  maxDurations,
  pan,
  rowOffsets,
  spanCount,
  zoom,
  type Detail,
  type Spans,
  type View,
} from "./layout";
import { Listeners, type EventTargetLike, type ModelCallback } from "./listeners";

export interface Model {
  get(name: string): any;
  on(event: string, callback: ModelCallback): void;
  off(event: string, callback: ModelCallback): void;
  send(content: object): void; // anywidget's custom message to the kernel
}

/** The front end's request for the detail of the window it shows (only when `lod`). */
export interface WindowRequest {
  type: "window";
  id: number;
  t0: number; // microseconds, as the view's
  t1: number;
  width: number; // pixels of the time axis: how fine the kernel needs to aggregate
  rows: number[]; // the rows on the canvas, top to bottom
}

/**
 * The kernel's reply; its buffers are the marks' columns, sorted by row then start: starts
 * (Uint32: whole µs after `base`; Float64 µs when `start_bits` is 64), durations (Float32), how
 * many marks each of `rows` has (Int32), kinds (Uint16), depths (Uint8), counts (Uint32).
 */
export interface SpansReply {
  type: "spans";
  id: number; // the request's
  t0: number; // the window the marks cover (may be wider than asked)
  t1: number;
  rows: number[]; // the rows the marks are complete for, sorted
  base?: number; // what the starts count from
  start_bits?: number; // 32 (the default) or 64
  kernel_ms?: number; // the kernel's time to answer (recorded in data-last-kernel-ms)
}

/** A binary column as the model (DataView) or a custom message (DataView or buffer) hands it over. */
type Column = ArrayBufferView | ArrayBuffer | null | undefined;

const ROW_HEIGHT = 18;
const DEPTH_HEIGHT = 6;
const LABEL_WIDTH = 180;
const MAX_VISIBLE_ROWS = 30;
// A request unanswered this long is taken as lost (a kernel error), so the view may ask again
// instead of waiting for ever; checked when the view changes, no timer.
const LOST_REPLY_MS = 30_000;
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

/** The window requests of one view: at most one in flight, the latest view waits for its reply. */
interface DetailRequests {
  inFlight: { id: number; sentAt: number } | null;
  viewChanged: boolean; // the view moved while a request was in flight: ask again on its reply
  lastAsked: string; // the last request's window and rows, so an unchanged view is not asked twice
  replies: number;
}

/** Everything a frame, a hit test or an input handler needs. */
interface Viewer {
  el: HTMLElement;
  model: Model;
  data: Timeline;
  overviewSource: unknown[]; // the traits `data` was decoded from, to skip a reload of the same
  detail: Detail | null; // the kernel's last reply, drawn where it covers the view
  requests: DetailRequests;
  canvas: HTMLCanvasElement;
  context: CanvasRenderingContext2D;
  tooltip: HTMLDivElement;
  info: HTMLSpanElement;
  visibleKinds: Set<number>;
  filterText: string;
  shownRows: number[];
  firstRow: number;
  view: View;
  dragging: number | null; // clientX of the last drag position, null when not dragging
  marks: MarkColumns; // a row's marks while a frame is drawn (reused)
}

/** A copy of a binary column as typed array `kind` (a DataView, any other view, or a buffer). */
function typed<T>(kind: { new (buffer: ArrayBuffer): T }, value: Column): T {
  if (!value) return new kind(new ArrayBuffer(0));
  const view = ArrayBuffer.isView(value) ? value : new DataView(value);
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

/** The span columns, in the order of the traits and of a reply's buffers. */
const SPAN_COLUMNS = ["starts", "durations", "rows", "kinds", "depths", "counts"];

/**
 * Typed spans from the binary columns (sorted by row, then start; row values index `rowCount`
 * rows). Counts may be empty: then every mark is one real span.
 */
export function decodeSpans(columns: Column[], rowCount: number): Spans {
  const [starts, durations, rows, kinds, depths, counts] = columns.map((c) => c ?? null);
  const startArray = typed(Float64Array, starts);
  const durationArray = typed(Float32Array, durations);
  const countArray = typed(Uint32Array, counts);
  const offsets = rowOffsets(typed(Int32Array, rows), rowCount);
  return {
    starts: startArray,
    durations: durationArray,
    kinds: typed(Uint16Array, kinds),
    depths: typed(Uint8Array, depths),
    rowOffsets: offsets,
    maxDuration: maxDurations(durationArray, offsets),
    counts: countArray.length && countArray.length === startArray.length ? countArray : undefined,
  };
}

/** Decode the model's binary columns into typed arrays (the overview when `lod`). */
export function loadTimeline(model: Model): Timeline {
  const rowNames: string[] = model.get("row_names");
  return {
    rowNames,
    activityNames: model.get("activity_names"),
    spans: decodeSpans(SPAN_COLUMNS.map((name) => model.get(name)), rowNames.length),
    cycles: typed(Float64Array, model.get("cycles")),
    bounds: [0, Math.max(1, model.get("end_us"))],
  };
}

/**
 * A reply's marks as a detail layer; its row offsets span all rows of the timeline (and any row
 * the reply names beyond them, from an overview not here yet, so its offsets stay consistent).
 */
export function loadDetail(reply: SpansReply, buffers: Column[], rowCount: number): Detail {
  const rows = reply.rows ?? [];
  const count = rows.reduce((n, row) => Math.max(n, row + 1), rowCount);
  return { spans: decodeReply(reply, buffers, count), rows: new Set(rows), t0: reply.t0, t1: reply.t1 };
}

/** A reply's marks (see SpansReply) as spans whose row offsets cover `rowCount` rows. */
export function decodeReply(reply: SpansReply, buffers: Column[], rowCount: number): Spans {
  const [starts, durations, perRow, kinds, depths, counts] = buffers;
  let startArray: Float64Array;
  if (reply.start_bits === 64) startArray = typed(Float64Array, starts);
  else {
    const after = typed(Uint32Array, starts);
    const base = reply.base ?? 0;
    startArray = new Float64Array(after.length);
    for (let i = 0; i < after.length; i++) startArray[i] = base + after[i];
  }
  const offsets = new Int32Array(rowCount + 1);
  const got = typed(Int32Array, perRow);
  (reply.rows ?? []).forEach((row, i) => (offsets[row + 1] = got[i] ?? 0));
  for (let r = 0; r < rowCount; r++) offsets[r + 1] += offsets[r];
  const durationArray = typed(Float32Array, durations);
  const countArray = typed(Uint32Array, counts);
  return {
    starts: startArray,
    durations: durationArray,
    kinds: typed(Uint16Array, kinds),
    depths: typed(Uint8Array, depths),
    rowOffsets: offsets,
    maxDuration: maxDurations(durationArray, offsets),
    counts: countArray.length === startArray.length ? countArray : undefined,
  };
}

/** What a reload compares to tell a new overview from the one shown. */
function overviewSource(model: Model): unknown[] {
  return ["row_names", "activity_names", ...SPAN_COLUMNS, "cycles", "end_us"].map((name) => model.get(name));
}

function sameValues(a: readonly unknown[], b: readonly unknown[]): boolean {
  return a.length === b.length && a.every((value, i) => value === b[i]);
}

/** The rows whose tensor name contains `text` (case-insensitive). */
function matchingRows(rowNames: string[], text: string): number[] {
  const needle = text.toLowerCase();
  return rowNames.map((_, i) => i).filter((i) => rowNames[i].toLowerCase().includes(needle));
}

// --- DOM ------------------------------------------------------------------------------------

/** Tensor filter, "whole run" button and info line; addKindBoxes adds the activity checkboxes. */
function buildToolbar(): Toolbar {
  const element = document.createElement("div");
  element.style.cssText = "display:flex;gap:8px;align-items:center;font:12px sans-serif;margin-bottom:4px;flex-wrap:wrap";
  const filter = document.createElement("input");
  filter.placeholder = "filter tensors";
  filter.style.width = "160px";
  const reset = document.createElement("button");
  reset.textContent = "whole run";
  const info = document.createElement("span");
  element.append(filter, reset, info);
  return { element, filter, reset, info, kindBoxes: [] };
}

/**
 * A checked checkbox for each activity that has none yet: all of them on the first call, those a
 * replaced overview added later (the kernel appends activities, so kinds keep their index).
 */
function addKindBoxes(v: Viewer, toolbar: Toolbar, listeners: Listeners): void {
  for (let kind = toolbar.kindBoxes.length; kind < v.data.activityNames.length; kind++) {
    const label = document.createElement("label");
    const box = document.createElement("input");
    box.type = "checkbox";
    box.checked = true;
    label.append(box, ` ${v.data.activityNames[kind]}`);
    label.style.color = colour(kind);
    toolbar.element.append(label);
    toolbar.kindBoxes.push(box);
    v.visibleKinds.add(kind);
    listeners.on(box, "change", () => showKind(v, kind, box.checked));
  }
}

/** Fill `el` with the toolbar, the canvas and the tooltip; the view starts on the whole run. */
function createViewer(el: HTMLElement, model: Model, data: Timeline, toolbar: Toolbar): Viewer {
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
    model,
    data,
    overviewSource: overviewSource(model),
    detail: null,
    requests: { inFlight: null, viewChanged: false, lastAsked: "", replies: 0 },
    canvas,
    context: canvas.getContext("2d")!,
    tooltip,
    info: toolbar.info,
    visibleKinds: new Set(), // filled by addKindBoxes
    filterText: "",
    shownRows: data.rowNames.map((_, i) => i),
    firstRow: 0,
    view: { t0: data.bounds[0], t1: data.bounds[1], width: width - LABEL_WIDTH },
    dragging: null,
    marks: new MarkColumns(),
  };
  fitCanvasHeight(viewer);
  return viewer;
}

function visibleRowCount(v: Viewer): number {
  return Math.min(v.shownRows.length, MAX_VISIBLE_ROWS);
}

/** The rows on the canvas, top to bottom. */
function visibleRows(v: Viewer): number[] {
  return v.shownRows.slice(v.firstRow, v.firstRow + visibleRowCount(v));
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
  const rects = new Map<number, number[]>();
  for (let slot = 0; slot < count && v.firstRow + slot < v.shownRows.length; slot++) drawRow(v, slot, rects);
  fillRects(v, rects);
  drawCycleMarks(v, count);
  drawAxis(v, count);
  const span = format(v.view.t1 - v.view.t0);
  v.info.textContent = `${v.shownRows.length} tensors, rows ${v.firstRow + 1}–${v.firstRow + count}, window ${span}`;
  v.el.dataset.lastFrameMs = (performance.now() - frameStart).toFixed(2);
  v.el.dataset.endUs = v.data.bounds[1].toFixed(0); // grows while a run still writes the timeline
}

/**
 * The row in visible slot `slot`: striped background and tensor name drawn, its marks added to
 * `rects` (x, y, width, height by style: see fillRects).
 */
function drawRow(v: Viewer, slot: number, rects: Map<number, number[]>): void {
  const { context, canvas } = v;
  const row = v.shownRows[v.firstRow + slot];
  const y = slot * ROW_HEIGHT;
  context.fillStyle = slot % 2 ? "#fafafa" : "#fff";
  context.fillRect(0, y, canvas.width, ROW_HEIGHT);
  context.fillStyle = "#333";
  context.fillText(v.data.rowNames[row].slice(0, 28), 4, y + 13);
  const kinds = Math.max(1, v.data.activityNames.length);
  const marks = v.marks;
  layoutRowInto(layerFor(v.data.spans, v.detail, row, v.view), row, v.view, marks, v.visibleKinds);
  for (let m = 0; m < marks.length; m++) {
    const x0 = Math.max(LABEL_WIDTH, LABEL_WIDTH + marks.x[m]);
    const x1 = Math.min(canvas.width, LABEL_WIDTH + marks.x[m] + marks.w[m]);
    if (x1 <= x0) continue;
    const depth = marks.depth[m];
    // depth first (children over their parents), then kind; merged marks before spans
    const style = ((depth * kinds + marks.kind[m]) * 2 + (marks.count[m] > 1 ? 0 : 1)) | 0;
    let list = rects.get(style);
    if (!list) rects.set(style, (list = []));
    list.push(x0, y + 1 + depth * DEPTH_HEIGHT, Math.max(1, x1 - x0), ROW_HEIGHT - 2 - depth * DEPTH_HEIGHT);
  }
}

/**
 * Fill the frame's marks one style at a time (a colour, and faint for merged marks): a few
 * style changes a frame rather than one a mark, which the canvas pays for on every fill.
 */
function fillRects(v: Viewer, rects: Map<number, number[]>): void {
  const { context } = v;
  const kinds = Math.max(1, v.data.activityNames.length);
  for (const style of [...rects.keys()].sort((a, b) => a - b)) {
    context.fillStyle = colour(Math.floor(style / 2) % kinds);
    context.globalAlpha = style % 2 ? 1 : 0.6;
    const list = rects.get(style)!;
    for (let i = 0; i < list.length; i += 4) context.fillRect(list[i], list[i + 1], list[i + 2], list[i + 3]);
  }
  context.globalAlpha = 1;
}

/** A vertical line at each pixel of the window where a CYCLE_START falls: one path, one stroke. */
function drawCycleMarks(v: Viewer, count: number): void {
  const { context } = v;
  const pixels = cyclePixels(v.data.cycles, v.view);
  if (!pixels.length) return;
  context.strokeStyle = "rgba(0,0,0,0.25)";
  context.beginPath();
  for (const x of pixels) {
    context.moveTo(LABEL_WIDTH + x + 0.5, 0);
    context.lineTo(LABEL_WIDTH + x + 0.5, count * ROW_HEIGHT);
  }
  context.stroke();
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

/**
 * The span under canvas point (offsetX, offsetY), deepest first, or null; searched in the layer
 * the row was drawn from, so the tooltip describes the mark under the cursor.
 */
function spanAt(v: Viewer, offsetX: number, offsetY: number): { row: number; index: number; spans: Spans } | null {
  const slot = Math.floor(offsetY / ROW_HEIGHT);
  const row = v.shownRows[v.firstRow + slot];
  const depth = Math.max(0, Math.floor((offsetY - slot * ROW_HEIGHT - 1) / DEPTH_HEIGHT));
  const x = offsetX - LABEL_WIDTH;
  if (row === undefined || x < 0) return null;
  const spans = layerFor(v.data.spans, v.detail, row, v.view);
  let index = -1;
  for (let d = depth; d >= 0 && index < 0; d--) index = hitTest(spans, row, v.view, x, d);
  return index < 0 ? null : { row, index, spans };
}

/**
 * A span's tooltip text. A mark the kernel aggregated says how many spans it stands for; its
 * activity is that of the longest of them, and its duration the time they cover.
 */
function tooltipText(v: Viewer, spans: Spans, row: number, index: number): string {
  const activity = v.data.activityNames[spans.kinds[index]];
  const where = `${v.data.rowNames[row]} · at ${format(spans.starts[index])} · ${format(spans.durations[index])}`;
  const count = spanCount(spans, index);
  return count > 1 ? `${count} spans · ${activity} (longest) · ${where}` : `${activity} · ${where}`;
}

function showTooltip(v: Viewer, event: MouseEvent): void {
  const hit = spanAt(v, event.offsetX, event.offsetY);
  if (!hit) return hideTooltip(v);
  v.tooltip.textContent = tooltipText(v, hit.spans, hit.row, hit.index);
  v.tooltip.style.left = `${event.clientX + 12}px`;
  v.tooltip.style.top = `${event.clientY + 12}px`;
  v.tooltip.style.display = "block";
}

function hideTooltip(v: Viewer): void {
  v.tooltip.style.display = "none";
}

// --- detail from the kernel -----------------------------------------------------------------

// Request ids are unique over every view of the page: all views of a model receive each reply,
// and a view takes only the reply to its own request.
let nextRequestId = 1;

/**
 * Ask the kernel for the detail of what is shown, when it serves level of detail. One request at
 * a time: while one is in flight only note that the view moved, and its reply sends the latest
 * view, so a drag costs one request per round trip rather than one per mouse move.
 */
function requestDetail(v: Viewer): void {
  if (!v.model.get("lod")) return;
  const { inFlight } = v.requests;
  if (inFlight && performance.now() - inFlight.sentAt < LOST_REPLY_MS) {
    v.requests.viewChanged = true;
    return;
  }
  if (inFlight) v.requests.lastAsked = ""; // lost: its view may be asked again
  sendWindowRequest(v);
}

/** Send the request for the current view, unless there is nothing to ask or it was just asked. */
function sendWindowRequest(v: Viewer): void {
  const { requests, view } = v;
  const rows = visibleRows(v);
  const asked = JSON.stringify([view.t0, view.t1, view.width, rows]);
  requests.viewChanged = false;
  requests.inFlight = null;
  if (rows.length === 0 || asked === requests.lastAsked) return;
  const request: WindowRequest = { type: "window", id: nextRequestId++, t0: view.t0, t1: view.t1, width: view.width, rows };
  requests.inFlight = { id: request.id, sentAt: performance.now() };
  requests.lastAsked = asked;
  v.model.send(request);
}

/**
 * The kernel's reply: keep it as the detail layer (the overview stays for what it does not
 * cover), redraw, record the round trip, then ask for the view the user moved on to meanwhile.
 */
function onReply(v: Viewer, content: SpansReply | { type?: unknown }, buffers: Column[] | undefined): void {
  const { inFlight } = v.requests;
  if (content?.type !== "spans" || !inFlight || (content as SpansReply).id !== inFlight.id) return;
  v.requests.inFlight = null;
  const decodeStart = performance.now();
  v.detail = loadDetail(content as SpansReply, buffers ?? [], v.data.rowNames.length);
  v.el.dataset.lastDecodeMs = (performance.now() - decodeStart).toFixed(2);
  v.el.dataset.lastKernelMs = String((content as SpansReply).kernel_ms ?? "");
  drawFrame(v);
  v.el.dataset.lastRoundTripMs = (performance.now() - inFlight.sentAt).toFixed(1);
  v.el.dataset.detailReplies = String(++v.requests.replies);
  if (v.requests.viewChanged) sendWindowRequest(v);
}

/**
 * The kernel replaced the overview (the run is still writing its file): decode it again, keep
 * the view (or the whole run, if that was shown) and ask for the detail again, as it may have
 * grown too. A change of the rows invalidates the detail, whose row indices were the old ones'.
 */
function reloadOverview(v: Viewer, toolbar: Toolbar, listeners: Listeners): void {
  const source = overviewSource(v.model);
  if (sameValues(source, v.overviewSource)) return; // the other trait of the same update
  const old = v.data;
  const wasWholeRun = v.view.t0 <= old.bounds[0] && v.view.t1 >= old.bounds[1];
  v.overviewSource = source;
  v.data = loadTimeline(v.model);
  if (!sameValues(old.rowNames, v.data.rowNames) || !v.model.get("lod")) v.detail = null;
  v.shownRows = matchingRows(v.data.rowNames, v.filterText);
  v.firstRow = Math.max(0, Math.min(v.firstRow, v.shownRows.length - visibleRowCount(v)));
  fitCanvasHeight(v);
  addKindBoxes(v, toolbar, listeners);
  const { bounds } = v.data;
  // zoom by 1 around the left edge just fits the window into the new bounds
  v.view = wasWholeRun ? { t0: bounds[0], t1: bounds[1], width: v.view.width } : zoom(v.view, 0, 1, bounds);
  v.requests.lastAsked = "";
  viewChanged(v);
}

// --- input ----------------------------------------------------------------------------------

/** The window or the rows shown changed: redraw, and ask the kernel for their detail. */
function viewChanged(v: Viewer): void {
  drawFrame(v);
  requestDetail(v);
}

/** Wheel zooms around the cursor; shift+wheel scrolls rows by one. */
function onWheel(v: Viewer, event: WheelEvent): void {
  event.preventDefault();
  if (event.shiftKey) {
    const last = v.shownRows.length - visibleRowCount(v);
    v.firstRow = Math.max(0, Math.min(last, v.firstRow + Math.sign(event.deltaY || event.deltaX)));
  } else {
    v.view = zoom(v.view, event.offsetX - LABEL_WIDTH, event.deltaY < 0 ? 0.8 : 1.25, v.data.bounds);
  }
  viewChanged(v);
}

/** While dragging, pan; otherwise show what is under the cursor. */
function onMouseMove(v: Viewer, event: MouseEvent): void {
  if (v.dragging === null) return showTooltip(v, event);
  v.view = pan(v.view, event.clientX - v.dragging, v.data.bounds);
  v.dragging = event.clientX;
  viewChanged(v);
}

function applyFilter(v: Viewer, text: string): void {
  v.filterText = text;
  v.shownRows = matchingRows(v.data.rowNames, text);
  v.firstRow = 0;
  fitCanvasHeight(v);
  viewChanged(v);
}

function showKind(v: Viewer, kind: number, shown: boolean): void {
  if (shown) v.visibleKinds.add(kind);
  else v.visibleKinds.delete(kind);
  drawFrame(v);
}

function showWholeRun(v: Viewer): void {
  v.view = { t0: v.data.bounds[0], t1: v.data.bounds[1], width: v.view.width };
  viewChanged(v);
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
  addKindBoxes(v, toolbar, listeners);
}

/** The kernel's replies, and a new overview (one update may change both traits: one reload). */
function bindModel(v: Viewer, toolbar: Toolbar, listeners: Listeners): void {
  listeners.onModel(v.model, "msg:custom", (content, buffers) => onReply(v, content, buffers));
  const reload = () => reloadOverview(v, toolbar, listeners);
  listeners.onModel(v.model, "change:starts", reload);
  listeners.onModel(v.model, "change:end_us", reload);
}

// --- entry point ----------------------------------------------------------------------------

/**
 * anywidget's render: draw the model into `el`, record `data-first-paint-ms`, ask for the
 * window's detail (when `lod`), and return the cleanup anywidget calls when the view goes away,
 * which removes every listener render added (including the one on `host`, the window, and the
 * model's) and the tooltip. Replies set `data-last-round-trip-ms` (and its parts: `data-last-kernel-ms`,
 * `data-last-decode-ms`, `data-last-frame-ms`) and count `data-detail-replies`.
 */
export function render({ model, el }: { model: Model; el: HTMLElement }, host: EventTargetLike = window): () => void {
  const started = performance.now();
  const data = loadTimeline(model);
  const toolbar = buildToolbar();
  const viewer = createViewer(el, model, data, toolbar);
  const listeners = new Listeners();
  bindCanvas(viewer, listeners, host);
  bindToolbar(viewer, toolbar, listeners);
  bindModel(viewer, toolbar, listeners);
  drawFrame(viewer);
  el.dataset.firstPaintMs = (performance.now() - started).toFixed(1);
  el.dataset.detailReplies = "0";
  requestDetail(viewer);
  return () => {
    listeners.dispose();
    viewer.tooltip.remove();
  };
}

export default { render };
