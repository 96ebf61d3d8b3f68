// The Horovod Timeline viewer: an anywidget front end drawing on a canvas.
// Rows are tensors, coloured spans are activities; wheel zooms around the cursor, dragging pans,
// shift+wheel scrolls rows, hovering shows a span's details, the toolbar filters.
import { hitTest, layoutRow, maxDurations, pan, rowOffsets, zoom, type Spans, type View } from "./layout";

interface Model {
  get(name: string): any;
  on(event: string, callback: () => void): void;
  off(event: string, callback: () => void): void;
}

const ROW_HEIGHT = 18;
const DEPTH_HEIGHT = 6;
const LABEL_WIDTH = 180;
const PALETTE = ["#1e88e5", "#43a047", "#fb8c00", "#8e24aa", "#e53935", "#00acc1", "#6d4c41", "#c0ca33", "#5e35b1", "#d81b60"];

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

function render({ model, el }: { model: Model; el: HTMLElement }): () => void {
  const started = performance.now();
  const rowNames: string[] = model.get("row_names");
  const activityNames: string[] = model.get("activity_names");
  const rows = typed(Int32Array, model.get("rows"));
  const durations = typed(Float32Array, model.get("durations"));
  const offsets = rowOffsets(rows, rowNames.length);
  const spans: Spans = {
    starts: typed(Float64Array, model.get("starts")),
    durations,
    kinds: typed(Uint8Array, model.get("kinds")),
    depths: typed(Uint8Array, model.get("depths")),
    rowOffsets: offsets,
    maxDuration: maxDurations(durations, offsets),
  };
  const cycles = typed(Float64Array, model.get("cycles"));
  const bounds: [number, number] = [0, Math.max(1, model.get("end_us"))];

  el.classList.add("hvd-timeline-viewer");
  el.innerHTML = "";
  const toolbar = document.createElement("div");
  toolbar.style.cssText = "display:flex;gap:8px;align-items:center;font:12px sans-serif;margin-bottom:4px;flex-wrap:wrap";
  const filter = document.createElement("input");
  filter.placeholder = "filter tensors";
  filter.style.width = "160px";
  const reset = document.createElement("button");
  reset.textContent = "whole run";
  const info = document.createElement("span");
  toolbar.append(filter, reset, info);
  const visibleKinds = new Set(activityNames.map((_, i) => i));
  activityNames.forEach((name, kind) => {
    const label = document.createElement("label");
    const box = document.createElement("input");
    box.type = "checkbox";
    box.checked = true;
    box.onchange = () => {
      if (box.checked) visibleKinds.add(kind);
      else visibleKinds.delete(kind);
      draw();
    };
    label.append(box, ` ${name}`);
    label.style.color = colour(kind);
    toolbar.append(label);
  });
  const canvas = document.createElement("canvas");
  canvas.style.cssText = "display:block;border:1px solid #ddd;cursor:grab";
  const tooltip = document.createElement("div");
  tooltip.style.cssText =
    "position:fixed;pointer-events:none;background:#222;color:#fff;font:11px monospace;padding:3px 6px;border-radius:3px;display:none;z-index:1000";
  el.append(toolbar, canvas, tooltip);

  let shownRows = rowNames.map((_, i) => i);
  let firstRow = 0;
  const width = Math.max(400, (el.clientWidth || 900) - 2);
  const visibleRowCount = () => Math.min(shownRows.length, 30);
  canvas.width = width;
  canvas.height = Math.max(1, visibleRowCount()) * ROW_HEIGHT + 16;
  let view: View = { t0: bounds[0], t1: bounds[1], width: width - LABEL_WIDTH };
  const context = canvas.getContext("2d")!;

  function draw(): void {
    const frameStart = performance.now();
    context.clearRect(0, 0, canvas.width, canvas.height);
    context.font = "11px sans-serif";
    const count = visibleRowCount();
    for (let slot = 0; slot < count && firstRow + slot < shownRows.length; slot++) {
      const row = shownRows[firstRow + slot];
      const y = slot * ROW_HEIGHT;
      context.fillStyle = slot % 2 ? "#fafafa" : "#fff";
      context.fillRect(0, y, canvas.width, ROW_HEIGHT);
      context.fillStyle = "#333";
      context.fillText(rowNames[row].slice(0, 28), 4, y + 13);
      for (const mark of layoutRow(spans, row, view, visibleKinds)) {
        const x0 = Math.max(LABEL_WIDTH, LABEL_WIDTH + mark.x);
        const x1 = Math.min(canvas.width, LABEL_WIDTH + mark.x + mark.w);
        if (x1 <= x0) continue;
        context.fillStyle = colour(mark.kind);
        context.globalAlpha = mark.count > 1 ? 0.6 : 1;
        context.fillRect(x0, y + 1 + mark.depth * DEPTH_HEIGHT, Math.max(1, x1 - x0), ROW_HEIGHT - 2 - mark.depth * DEPTH_HEIGHT);
      }
      context.globalAlpha = 1;
    }
    context.strokeStyle = "rgba(0,0,0,0.25)";
    const scale = view.width / (view.t1 - view.t0);
    for (let i = 0; i < cycles.length; i++) {
      if (cycles[i] < view.t0 || cycles[i] > view.t1) continue;
      const x = LABEL_WIDTH + (cycles[i] - view.t0) * scale;
      context.beginPath();
      context.moveTo(x, 0);
      context.lineTo(x, count * ROW_HEIGHT);
      context.stroke();
    }
    context.fillStyle = "#333";
    const axisY = count * ROW_HEIGHT + 12;
    context.fillText(format(view.t0), LABEL_WIDTH, axisY);
    const right = format(view.t1);
    context.fillText(right, canvas.width - context.measureText(right).width - 2, axisY);
    info.textContent = `${shownRows.length} tensors, rows ${firstRow + 1}–${firstRow + count}, window ${format(view.t1 - view.t0)}`;
    el.dataset.lastFrameMs = (performance.now() - frameStart).toFixed(2);
  }

  canvas.addEventListener("wheel", (event) => {
    event.preventDefault();
    if (event.shiftKey) {
      firstRow = Math.max(0, Math.min(shownRows.length - visibleRowCount(), firstRow + Math.sign(event.deltaY || event.deltaX)));
    } else {
      view = zoom(view, event.offsetX - LABEL_WIDTH, event.deltaY < 0 ? 0.8 : 1.25, bounds);
    }
    draw();
  });
  let dragging: number | null = null;
  canvas.addEventListener("mousedown", (event) => (dragging = event.clientX));
  window.addEventListener("mouseup", () => (dragging = null));
  canvas.addEventListener("mousemove", (event) => {
    if (dragging !== null) {
      view = pan(view, event.clientX - dragging, bounds);
      dragging = event.clientX;
      draw();
      return;
    }
    const slot = Math.floor(event.offsetY / ROW_HEIGHT);
    const row = shownRows[firstRow + slot];
    const depth = Math.max(0, Math.floor((event.offsetY - slot * ROW_HEIGHT - 1) / DEPTH_HEIGHT));
    const x = event.offsetX - LABEL_WIDTH;
    let index = -1;
    if (row !== undefined && x >= 0) {
      for (let d = depth; d >= 0 && index < 0; d--) index = hitTest(spans, row, view, x, d);
    }
    if (index < 0) {
      tooltip.style.display = "none";
      return;
    }
    tooltip.textContent = `${activityNames[spans.kinds[index]]} · ${rowNames[row]} · at ${format(spans.starts[index])} · ${format(spans.durations[index])}`;
    tooltip.style.left = `${event.clientX + 12}px`;
    tooltip.style.top = `${event.clientY + 12}px`;
    tooltip.style.display = "block";
  });
  canvas.addEventListener("mouseleave", () => (tooltip.style.display = "none"));
  filter.addEventListener("input", () => {
    const text = filter.value.toLowerCase();
    shownRows = rowNames.map((_, i) => i).filter((i) => rowNames[i].toLowerCase().includes(text));
    firstRow = 0;
    canvas.height = Math.max(1, visibleRowCount()) * ROW_HEIGHT + 16;
    draw();
  });
  reset.addEventListener("click", () => {
    view = { t0: bounds[0], t1: bounds[1], width: view.width };
    draw();
  });
  draw();
  el.dataset.firstPaintMs = (performance.now() - started).toFixed(1);
  return () => tooltip.remove();
}

export default { render };
