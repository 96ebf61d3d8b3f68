import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { Listeners } from "../src/listeners";
import viewer from "../src/viewer"; // the default export, as anywidget loads it

const { render } = viewer;
import { FakeDocument, FakeElement, FakeTarget, bytes, fakeModel, spanReply, type FakeMark } from "./fake-dom";

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
    const styles = frame.filter((d) => d.op === "fillRect" && (d.args[0] as number) >= LABEL_WIDTH).map((d) => d.fillStyle);
    expect(styles).toEqual([...new Array(30).fill("#1e88e5"), ...new Array(30).fill("#43a047")]); // depth by depth, a style at a time
    expect(frame.filter((d) => d.op === "stroke")).toHaveLength(1); // every cycle mark in one path
    expect(frame.filter((d) => d.op === "moveTo").map((d) => d.args[0])).toEqual([180.5, 180.5 + 359]);
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

describe("detail served by the kernel (lod)", () => {
  const LABEL_WIDTH = 180;
  const VIEW_WIDTH = 718;
  const firstRows = (n: number, from = 0) => Array.from({ length: n }, (_, i) => from + i);

  function parts(el: FakeElement) {
    const [canvas] = el.all("canvas");
    const [, tooltip] = el.all("div");
    return { canvas, tooltip, filter: el.all("input")[0], info: el.all("span")[0], reset: el.all("button")[0], frame: canvas.getContext("2d").frame };
  }

  /** The marks drawn in a row slot as [x, y, width, colour] (not the row's background). */
  function marksIn(el: FakeElement, slot: number) {
    return parts(el)
      .frame.filter((d) => d.op === "fillRect" && (d.args[0] as number) >= LABEL_WIDTH)
      .filter((d) => (d.args[1] as number) >= slot * 18 && (d.args[1] as number) < (slot + 1) * 18)
      .map((d) => [...(d.args.slice(0, 3) as number[]).map((n) => Math.round(n * 10) / 10), d.fillStyle]);
  }

  /** Play the kernel: answer request `request` with these marks for `rows` over [t0, t1]. */
  function answer(model: ReturnType<typeof fakeModel>, request: any, marks: FakeMark[], window?: { t0: number; t1: number; rows?: number[] }) {
    const rows = window?.rows ?? request.rows;
    const { fields, buffers } = spanReply(marks, rows);
    const content = { type: "spans", id: request.id, t0: window?.t0 ?? request.t0, t1: window?.t1 ?? request.t1, rows, ...fields };
    model.emit("msg:custom", content, buffers);
  }

  const showLod = (traits: Record<string, unknown> = {}) => show(fakeModel(40, { lod: true, ...traits }));

  it("sends nothing when lod is off, whatever the view does", () => {
    const { el, model } = show(fakeModel(40, { lod: false }));
    const { canvas, filter, reset } = parts(el);
    canvas.dispatch("wheel", { deltaY: -100, offsetX: LABEL_WIDTH + 100 });
    canvas.dispatch("wheel", { shiftKey: true, deltaY: 100 });
    canvas.dispatch("mousedown", { clientX: 300 });
    canvas.dispatch("mousemove", { clientX: 350, offsetX: 0, offsetY: 0 });
    filter.value = "layer1";
    filter.dispatch("input");
    reset.dispatch("click");
    expect(model.sent).toEqual([]);
    expect(el.dataset.detailReplies).toBe("0");
  });

  it("asks for the visible rows and the view's window right after the first render", () => {
    const { model } = showLod();
    expect(model.sent).toHaveLength(1);
    expect(model.sent[0]).toEqual({ type: "window", id: expect.any(Number), t0: 0, t1: 1000, width: VIEW_WIDTH, rows: firstRows(30) });
  });

  it("keeps one request in flight and sends only the latest view on its reply", () => {
    const { el, model } = showLod();
    const { canvas } = parts(el);
    for (let i = 0; i < 3; i++) canvas.dispatch("wheel", { deltaY: -100, offsetX: LABEL_WIDTH + VIEW_WIDTH / 2 });
    canvas.dispatch("mousedown", { clientX: 300 });
    for (let x = 301; x < 310; x++) canvas.dispatch("mousemove", { clientX: x, offsetX: 0, offsetY: 0 }); // a drag
    fakeWindow.dispatch("mouseup");
    expect(model.sent).toHaveLength(1);
    answer(model, model.sent[0], []);
    expect(model.sent).toHaveLength(2);
    const [first, latest] = model.sent;
    expect(latest.id).toBeGreaterThan(first.id);
    expect(latest.t1 - latest.t0).toBeCloseTo(512); // 1000 µs × 0.8³, dragged 9 px to the left
    expect(latest.t0).toBeCloseTo(244 - (9 * 512) / VIEW_WIDTH);
    expect([latest.width, latest.rows]).toEqual([VIEW_WIDTH, firstRows(30)]);
    answer(model, latest, []);
    expect(model.sent).toHaveLength(2); // the view did not move since: nothing more to ask
  });

  it("asks again after shift+wheel, the tensor filter and the whole-run button", () => {
    const { el, model } = showLod();
    const { canvas, filter, reset } = parts(el);
    const next = () => model.sent.at(-1);
    canvas.dispatch("wheel", { shiftKey: true, deltaY: 100 });
    answer(model, model.sent[0], []);
    expect(next().rows).toEqual(firstRows(30, 1));
    filter.value = "layer3";
    filter.dispatch("input");
    answer(model, next(), []);
    expect(next().rows).toEqual([3, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39]);
    canvas.dispatch("wheel", { deltaY: -100, offsetX: LABEL_WIDTH });
    answer(model, next(), []);
    reset.dispatch("click");
    answer(model, next(), []);
    expect(model.sent.map((m) => [m.t0, m.t1])).toEqual([[0, 1000], [0, 1000], [0, 1000], [0, 800], [0, 1000]]);
  });

  it("draws a reply's marks for the rows it covers, and the overview elsewhere", () => {
    const { el, model } = showLod();
    answer(model, model.sent[0], [{ row: 0, start: 600, duration: 100, kind: 1 }], { t0: 0, t1: 1000, rows: [0, 2] });
    expect(marksIn(el, 0)).toEqual([[LABEL_WIDTH + 430.8, 1, 71.8, "#43a047"]]); // the detail
    expect(marksIn(el, 1)).toEqual([[LABEL_WIDTH, 19, 287.2, "#1e88e5"], [LABEL_WIDTH + 71.8, 25, 35.9, "#43a047"]]); // not in the reply
    expect(marksIn(el, 2)).toEqual([]); // in the reply, with nothing in the window
  });

  it("takes a reply's buffers as ArrayBuffers too", () => {
    const { el, model } = showLod();
    const { fields, buffers } = spanReply([{ row: 0, start: 600, duration: 100, kind: 1 }], [0]);
    const raw = buffers.map((b) => b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength));
    model.emit("msg:custom", { type: "spans", id: model.sent[0].id, t0: 0, t1: 1000, rows: [0], ...fields }, raw);
    expect(marksIn(el, 0)).toEqual([[LABEL_WIDTH + 430.8, 1, 71.8, "#43a047"]]);
  });

  it("uses the overview while the view is not inside the reply's window", () => {
    const { el, model } = showLod();
    const { canvas } = parts(el);
    answer(model, model.sent[0], [{ row: 0, start: 300, duration: 50, kind: 1 }], { t0: 0, t1: 500, rows: [0] });
    expect(marksIn(el, 0).map((m) => m[3])).toEqual(["#1e88e5", "#43a047"]); // [0, 1000] is wider: overview
    for (let i = 0; i < 4; i++) canvas.dispatch("wheel", { deltaY: -100, offsetX: LABEL_WIDTH }); // [0, 409.6]
    expect(marksIn(el, 0)).toEqual([[LABEL_WIDTH + 525.9, 1, 87.6, "#43a047"]]); // 300 and 50 µs at 718 px / 409.6 µs
  });

  it("hit-tests the layer a row was drawn from; an aggregated mark says how many spans it stands for", () => {
    const { el, model } = showLod();
    const { canvas, tooltip } = parts(el);
    const at = (us: number) => LABEL_WIDTH + (us * VIEW_WIDTH) / 1000;
    answer(model, model.sent[0], [{ row: 0, start: 600, duration: 100, kind: 1, count: 5 }, { row: 1, start: 800, duration: 20 }], { t0: 0, t1: 1000, rows: [0, 1] });
    canvas.dispatch("mousemove", { offsetX: at(650), offsetY: 8, clientX: 0, clientY: 0 });
    expect(tooltip.textContent).toBe("5 spans · QUEUE (longest) · layer0 · at 600 µs · 100 µs");
    canvas.dispatch("mousemove", { offsetX: at(810), offsetY: 18 + 8, clientX: 0, clientY: 0 });
    expect(tooltip.textContent).toBe("ALLREDUCE · layer1 · at 800 µs · 20 µs");
    canvas.dispatch("mousemove", { offsetX: at(300), offsetY: 8, clientX: 0, clientY: 0 }); // only in the overview
    expect(tooltip.style.display).toBe("none");
    canvas.dispatch("mousemove", { offsetX: at(300), offsetY: 18 * 2 + 8, clientX: 0, clientY: 0 });
    expect(tooltip.textContent).toBe("ALLREDUCE · layer2 · at 0 µs · 400 µs");
  });

  it("shows the count of an aggregated mark of the overview, drawn as a merged mark", () => {
    const counts = Uint32Array.from({ length: 80 }, (_, i) => (i === 0 ? 7 : 1));
    const { el } = showLod({ counts: bytes(counts) });
    const { canvas, tooltip, frame } = parts(el);
    const blue = frame.filter((d) => d.op === "fillRect" && d.fillStyle === "#1e88e5");
    expect(blue.map((d) => d.alpha)).toEqual([0.6, ...new Array(29).fill(1)]); // merged marks are fainter
    canvas.dispatch("mousemove", { offsetX: LABEL_WIDTH + 10, offsetY: 8, clientX: 0, clientY: 0 });
    expect(tooltip.textContent).toBe("7 spans · ALLREDUCE (longest) · layer0 · at 0 µs · 400 µs");
  });

  it("records the round trip, counts replies, ignores other messages and other views' replies", () => {
    const model = fakeModel(40, { lod: true });
    const { el } = show(model);
    const other = show(model); // a second view of the same model receives every reply too
    expect([el.dataset.detailReplies, el.dataset.lastRoundTripMs]).toEqual(["0", undefined]);
    model.emit("msg:custom", { type: "progress", id: model.sent[0].id }, []);
    model.emit("msg:custom", { type: "spans", id: -1, t0: 0, t1: 1000, rows: [0] }, spanReply([], [0]).buffers);
    expect(el.dataset.detailReplies).toBe("0");
    answer(model, model.sent[0], [{ row: 0, start: 600, duration: 100, kind: 1 }]);
    expect(el.dataset.detailReplies).toBe("1");
    expect(Number(el.dataset.lastRoundTripMs)).toBeGreaterThanOrEqual(0);
    expect(el.dataset.lastRoundTripMs).toMatch(/^\d+\.\d$/);
    expect(other.el.dataset.detailReplies).toBe("0");
    expect(marksIn(other.el, 0).map((m) => m[3])).toEqual(["#1e88e5", "#43a047"]);
    answer(model, model.sent[1], []);
    expect([el.dataset.detailReplies, other.el.dataset.detailReplies]).toEqual(["1", "1"]);
  });

  it("reloads a replaced overview, keeps showing the whole run, and asks for the detail again", () => {
    const { el, model } = showLod();
    const { info } = parts(el);
    answer(model, model.sent[0], [{ row: 0, start: 600, duration: 100, kind: 1 }]);
    model.set({
      row_names: [...(model.get("row_names") as string[]), "layer40"],
      rows: bytes(Int32Array.from([0, 40])),
      starts: bytes(Float64Array.from([0, 1500])),
      durations: bytes(Float32Array.from([10, 400])),
      kinds: bytes(Uint16Array.from([0, 2])),
      depths: bytes(Uint8Array.from([0, 0])),
      activity_names: ["ALLREDUCE", "QUEUE", "MEMCPY_IN_FUSION_BUFFER"],
      end_us: 2000,
    });
    expect(info.textContent).toBe("41 tensors, rows 1–30, window 2.00 ms");
    expect(el.all("input")).toHaveLength(4); // the filter and a checkbox per activity, one new
    expect(marksIn(el, 0)).toEqual([[LABEL_WIDTH, 1, 3.6, "#1e88e5"]]); // the rows changed: the old detail is gone
    expect(model.sent).toHaveLength(2); // one request for both change events
    expect(model.sent[1]).toMatchObject({ t0: 0, t1: 2000, rows: firstRows(30) });
  });

  it("cleanup takes back the msg:custom and change listeners", () => {
    const { model, cleanup } = showLod();
    expect(["msg:custom", "change:starts", "change:end_us"].map((e) => model.subscriptions.count(e))).toEqual([1, 1, 1]);
    cleanup();
    expect(model.subscriptions.count()).toBe(0);
    model.emit("msg:custom", { type: "spans", id: model.sent[0].id, t0: 0, t1: 1000, rows: [] }, spanReply([], []).buffers); // no error, no listener
  });
});

describe("activity kinds", () => {
  it("keeps kinds past 255 apart (16 bits on the wire)", async () => {
    const { decodeSpans } = await import("../src/viewer");
    const spans = decodeSpans(
      [
        bytes(Float64Array.from([0, 10])),
        bytes(Float32Array.from([5, 5])),
        bytes(Int32Array.from([0, 0])),
        bytes(Uint16Array.from([255, 299])),
        bytes(Uint8Array.from([0, 0])),
        null,
      ],
      1,
    );
    expect(Array.from(spans.kinds)).toEqual([255, 299]);
  });
});

describe("window replies", () => {
  it("decode starts counted from a base (or 64-bit starts) and marks per row", async () => {
    const { decodeReply } = await import("../src/viewer");
    const marks = [
      { row: 3, start: 5e12, duration: 1 },
      { row: 1, start: 5e12 + 7, duration: 2 },
      { row: 3, start: 5e12 + 4e9, duration: 3 }, // 4e9 µs after the first: still 32 bits
    ];
    const { fields, buffers } = spanReply(marks, [1, 3]);
    const spans = decodeReply({ type: "spans", id: 1, t0: 0, t1: 1, rows: [1, 3], ...fields }, buffers, 5);
    expect(Array.from(spans.starts)).toEqual([5e12 + 7, 5e12, 5e12 + 4e9]);
    expect(Array.from(spans.rowOffsets)).toEqual([0, 0, 1, 1, 3, 3]);
    expect(Array.from(spans.durations)).toEqual([2, 1, 3]);
    const columns = [Float64Array.from([-3, 1e15]), Float32Array.from([1, 1]), Int32Array.from([2]), new Uint16Array(2), new Uint8Array(2), Uint32Array.from([1, 1])];
    const far = decodeReply({ type: "spans", id: 1, t0: 0, t1: 1, rows: [0], start_bits: 64 }, columns.map(bytes), 1);
    expect([Array.from(far.starts), Array.from(far.rowOffsets)]).toEqual([[-3, 1e15], [0, 2]]);
  });
});
