import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { Listeners } from "../src/listeners";
import viewer from "../src/viewer"; // the default export, as anywidget loads it

const { render } = viewer;
import { FakeDocument, FakeElement, FakeTarget, fakeModel } from "./fake-dom";

let fakeWindow: FakeTarget;
let fakeDocument: FakeDocument;

beforeEach(() => {
  fakeWindow = new FakeTarget();
  fakeDocument = new FakeDocument();
  vi.stubGlobal("window", fakeWindow);
  vi.stubGlobal("document", fakeDocument);
});

afterEach(() => {
  vi.unstubAllGlobals();
});

/** render() as anywidget calls it: one argument, the global window. */
function show(model = fakeModel()) {
  const el = new FakeElement("div");
  const cleanup = render({ model, el: el as unknown as HTMLElement });
  return { el, model, cleanup };
}

describe("render cleanup", () => {
  it("removes the window mouseup listener, every other listener and the tooltip", () => {
    const { el, model, cleanup } = show();
    expect(fakeWindow.count("mouseup")).toBe(1);
    expect(el.all("div")).toHaveLength(2); // toolbar and tooltip
    cleanup();
    expect(fakeWindow.count()).toBe(0);
    expect(fakeDocument.count()).toBe(0);
    expect(model.subscriptions.count()).toBe(0);
    expect(el.countTree()).toBe(0);
    expect(el.all("div")).toHaveLength(1); // the tooltip is gone
  });

  it("leaves no window listener after rendering twice and running both cleanups", () => {
    const model = fakeModel();
    const first = show(model);
    const second = show(model); // anywidget renders again when the widget is re-displayed
    expect(fakeWindow.count()).toBe(2);
    first.cleanup();
    expect(fakeWindow.count()).toBe(1);
    second.cleanup();
    expect(fakeWindow.count()).toBe(0);
    expect(fakeDocument.count()).toBe(0);
    expect(model.subscriptions.count()).toBe(0);
  });

  it("takes the window listener's target as a parameter", () => {
    const host = new FakeTarget();
    const cleanup = render({ model: fakeModel(), el: new FakeElement("div") as unknown as HTMLElement }, host);
    expect([host.count("mouseup"), fakeWindow.count()]).toEqual([1, 0]);
    cleanup();
    expect(host.count()).toBe(0);
  });
});

describe("Listeners", () => {
  it("removes DOM listeners and model callbacks (with off) on dispose, once", () => {
    const target = new FakeTarget();
    const model = fakeModel();
    const listeners = new Listeners();
    const seen: string[] = [];
    listeners.on(target, "mouseup", () => seen.push("mouseup"));
    listeners.on(target, "keydown", () => seen.push("keydown"));
    listeners.onModel(model, "change:starts", () => seen.push("change"));
    target.dispatch("mouseup");
    expect([target.count(), model.subscriptions.count(), listeners.size]).toEqual([2, 1, 3]);
    listeners.dispose();
    listeners.dispose();
    target.dispatch("mouseup");
    expect([target.count(), model.subscriptions.count(), listeners.size]).toEqual([0, 0, 0]);
    expect(seen).toEqual(["mouseup"]);
  });
});

describe("viewer behaviour", () => {
  const LABEL_WIDTH = 180;
  const VIEW_WIDTH = 718; // canvas 898 px (no clientWidth: 900 - 2) minus the labels

  function parts(el: FakeElement) {
    const [canvas] = el.all("canvas");
    const [toolbar, tooltip] = el.all("div");
    const [filter, ...boxes] = el.all("input");
    return { canvas, tooltip, filter, boxes, info: el.all("span")[0], reset: el.all("button")[0], frame: canvas.getContext("2d").frame };
  }
  const leftTime = (frame: ReturnType<typeof parts>["frame"]) => frame.filter((d) => d.op === "fillText").at(-2)!.args[0];

  it("sets the data attributes the browser test reads and draws rows, spans and cycle marks", () => {
    const { el } = show();
    const { canvas, info, frame, boxes } = parts(el);
    expect(el.classes.has("hvd-timeline-viewer")).toBe(true);
    expect(Number(el.dataset.firstPaintMs)).toBeGreaterThanOrEqual(0);
    expect(Number(el.dataset.lastFrameMs)).toBeGreaterThanOrEqual(0);
    expect(info.textContent).toBe("40 tensors, rows 1–30, window 1.00 ms");
    expect([canvas.width, canvas.height]).toEqual([898, 30 * 18 + 16]);
    expect(frame.filter((d) => d.op === "fillRect" && d.fillStyle === "#1e88e5")).toHaveLength(30);
    expect(frame.filter((d) => d.op === "stroke")).toHaveLength(2);
    expect(boxes.map((b) => [b.type, b.checked])).toEqual([["checkbox", true], ["checkbox", true]]);
  });

  it("zooms around the cursor on wheel, pans on drag until the window's mouseup", () => {
    const { el } = show();
    const { canvas, info, frame, reset } = parts(el);
    canvas.dispatch("wheel", { deltaY: -100, offsetX: LABEL_WIDTH + VIEW_WIDTH / 2 });
    expect(info.textContent).toBe("40 tensors, rows 1–30, window 800 µs");
    expect(leftTime(frame)).toBe("100 µs"); // 500 µs stayed under the cursor
    canvas.dispatch("mousedown", { clientX: 300 });
    canvas.dispatch("mousemove", { clientX: 300 + VIEW_WIDTH * 0.1, offsetX: 0, offsetY: 0 });
    expect(leftTime(frame)).toBe("20 µs"); // dragging right shows earlier times
    fakeWindow.dispatch("mouseup");
    canvas.dispatch("mousemove", { clientX: 0, offsetX: 0, offsetY: 0 });
    expect(leftTime(frame)).toBe("20 µs");
    reset.dispatch("click");
    expect(info.textContent).toBe("40 tensors, rows 1–30, window 1.00 ms");
  });

  it("scrolls rows with shift+wheel", () => {
    const { el } = show();
    const { canvas, info } = parts(el);
    canvas.dispatch("wheel", { shiftKey: true, deltaY: 100 });
    expect(info.textContent).toBe("40 tensors, rows 2–31, window 1.00 ms");
    for (let i = 0; i < 20; i++) canvas.dispatch("wheel", { shiftKey: true, deltaY: 100 });
    expect(info.textContent).toBe("40 tensors, rows 11–40, window 1.00 ms");
  });

  it("shows a tooltip for the span under the cursor, deepest first", () => {
    const { el } = show();
    const { canvas, tooltip } = parts(el);
    const at = (us: number) => LABEL_WIDTH + (us * VIEW_WIDTH) / 1000;
    canvas.dispatch("mousemove", { offsetX: at(120), offsetY: 18 + 8, clientX: 50, clientY: 60 });
    expect(tooltip.textContent).toBe("QUEUE · layer1 · at 100 µs · 50 µs");
    expect([tooltip.style.display, tooltip.style.left, tooltip.style.top]).toEqual(["block", "62px", "72px"]);
    canvas.dispatch("mousemove", { offsetX: at(300), offsetY: 18 + 8, clientX: 50, clientY: 60 });
    expect(tooltip.textContent).toBe("ALLREDUCE · layer1 · at 0 µs · 400 µs");
    canvas.dispatch("mousemove", { offsetX: at(700), offsetY: 8, clientX: 0, clientY: 0 });
    expect(tooltip.style.display).toBe("none");
    canvas.dispatch("mousemove", { offsetX: at(120), offsetY: 8, clientX: 0, clientY: 0 });
    canvas.dispatch("mouseleave");
    expect(tooltip.style.display).toBe("none");
  });

  it("filters tensors by name and activities by checkbox", () => {
    const { el } = show();
    const { canvas, filter, boxes, info, frame } = parts(el);
    filter.value = "LAYER1";
    filter.dispatch("input");
    expect(info.textContent).toBe("11 tensors, rows 1–11, window 1.00 ms"); // layer1, layer10…19
    expect(canvas.height).toBe(11 * 18 + 16);
    boxes[0].checked = false;
    boxes[0].dispatch("change");
    expect(frame.filter((d) => d.op === "fillRect" && d.fillStyle === "#1e88e5")).toHaveLength(0);
    expect(frame.filter((d) => d.op === "fillRect" && d.fillStyle === "#43a047")).toHaveLength(11);
  });
});
