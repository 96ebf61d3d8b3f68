import { describe, expect, it } from "vitest";
import { MarkColumns, cyclePixels, hitTest, layerFor, layoutRow, layoutRowInto, lowerBound, maxDurations, pan, rowOffsets, zoom, type Spans } from "../src/layout";

function spans(rows: number[], starts: number[], durations: number[], depths?: number[]): Spans {
  const rowArray = Int32Array.from(rows);
  const offsets = rowOffsets(rowArray, Math.max(...rows) + 1);
  const dur = Float32Array.from(durations);
  return {
    starts: Float64Array.from(starts),
    durations: dur,
    kinds: new Uint8Array(starts.length).map((_, i) => i % 3),
    depths: Uint8Array.from(depths ?? starts.map(() => 0)),
    rowOffsets: offsets,
    maxDuration: maxDurations(dur, offsets),
  };
}

describe("rows", () => {
  it("finds where each row starts", () => {
    expect(Array.from(rowOffsets(Int32Array.from([0, 0, 1, 3, 3, 3]), 4))).toEqual([0, 2, 3, 3, 6]);
  });
  it("binary-searches sorted starts", () => {
    const values = Float64Array.from([1, 3, 3, 7]);
    expect(lowerBound(values, 0, 4, 3)).toBe(1);
    expect(lowerBound(values, 0, 4, 8)).toBe(4);
    expect(lowerBound(values, 2, 4, 0)).toBe(2);
  });
});

describe("layoutRow", () => {
  it("places wide spans in pixels and skips those outside the window", () => {
    const s = spans([0, 0, 0], [0, 100, 900], [50, 100, 50]);
    const marks = layoutRow(s, 0, { t0: 60, t1: 260, width: 200 });
    expect(marks.map((m) => [m.x, m.w, m.index])).toEqual([[40, 100, 1]]);
  });
  it("keeps a long span that started before the window", () => {
    const s = spans([0, 0], [0, 500], [1000, 10]);
    const marks = layoutRow(s, 0, { t0: 400, t1: 600, width: 100 });
    expect(marks[0].index).toBe(0);
    expect(marks[0].x).toBeLessThan(0);
  });
  it("merges sub-pixel spans per pixel and depth (level of detail)", () => {
    const n = 100_000;
    const starts = Array.from({ length: n }, (_, i) => i * 10);
    const s = spans(new Array(n).fill(0), starts, new Array(n).fill(1));
    const marks = layoutRow(s, 0, { t0: 0, t1: n * 10, width: 1000 });
    expect(marks.length).toBe(1000);
    expect(marks.reduce((sum, m) => sum + m.count, 0)).toBe(n);
  });
  it("counts a kernel-aggregated mark as the spans it stands for, wide or merged again", () => {
    const s = { ...spans([0, 0, 0, 0], [0, 100, 100.2, 100.4], [50, 0.1, 0.1, 0.1]), counts: Uint32Array.from([5, 3, 1, 2]) };
    const marks = layoutRow(s, 0, { t0: 0, t1: 200, width: 200 });
    expect(marks.map((m) => [m.x, m.w, m.count, m.index])).toEqual([[0, 50, 5, 0], [100, 1, 6, 1]]);
  });
  it("takes every mark as one span without counts", () => {
    const s = spans([0, 0], [0, 100], [50, 0.1]);
    expect(layoutRow(s, 0, { t0: 0, t1: 200, width: 200 }).map((m) => m.count)).toEqual([1, 1]);
  });
  it("filters by activity", () => {
    const s = spans([0, 0, 0], [0, 10, 20], [5, 5, 5]);
    const marks = layoutRow(s, 0, { t0: 0, t1: 30, width: 300 }, new Set([1]));
    expect(marks.map((m) => m.index)).toEqual([1]);
  });
});

describe("navigation", () => {
  const bounds: [number, number] = [0, 1000];
  it("zooms around the cursor", () => {
    const view = zoom({ t0: 0, t1: 1000, width: 100 }, 25, 0.5, bounds);
    expect(view.t1 - view.t0).toBe(500);
    expect(view.t0 + ((view.t1 - view.t0) * 25) / 100).toBeCloseTo(250);
  });
  it("never zooms out past the whole timeline nor in past 10 us", () => {
    expect(zoom({ t0: 0, t1: 1000, width: 100 }, 50, 4, bounds)).toEqual({ t0: 0, t1: 1000, width: 100 });
    const deep = zoom({ t0: 500, t1: 520, width: 100 }, 50, 0.01, bounds);
    expect(deep.t1 - deep.t0).toBe(10);
  });
  it("pans and stops at the edges", () => {
    expect(pan({ t0: 100, t1: 200, width: 100 }, 50, bounds)).toEqual({ t0: 50, t1: 150, width: 100 });
    expect(pan({ t0: 100, t1: 200, width: 100 }, 500, bounds)).toEqual({ t0: 0, t1: 100, width: 100 });
  });
});

describe("layerFor", () => {
  const overview = spans([0, 1], [0, 0], [10, 10]);
  const detail = { spans: spans([0], [5], [1]), rows: new Set([0]), t0: 100, t1: 500 };
  it("uses the detail for its rows while the view is inside its window", () => {
    expect(layerFor(overview, detail, 0, { t0: 100, t1: 500, width: 10 })).toBe(detail.spans);
    expect(layerFor(overview, detail, 0, { t0: 200, t1: 300, width: 10 })).toBe(detail.spans);
  });
  it("uses the overview for other rows, a view reaching outside, or no detail", () => {
    expect(layerFor(overview, detail, 1, { t0: 200, t1: 300, width: 10 })).toBe(overview);
    expect(layerFor(overview, detail, 0, { t0: 50, t1: 300, width: 10 })).toBe(overview);
    expect(layerFor(overview, detail, 0, { t0: 200, t1: 501, width: 10 })).toBe(overview);
    expect(layerFor(overview, null, 0, { t0: 200, t1: 300, width: 10 })).toBe(overview);
  });
});

describe("hitTest", () => {
  it("finds the span under the cursor at a depth", () => {
    const s = spans([0, 0, 0], [0, 10, 12], [30, 5, 1], [0, 1, 1]);
    const view = { t0: 0, t1: 40, width: 400 };
    expect(hitTest(s, 0, view, 125, 1)).toBe(2);
    expect(hitTest(s, 0, view, 125, 0)).toBe(0);
    expect(hitTest(s, 0, view, 380, 0)).toBe(-1);
  });
});

describe("cyclePixels", () => {
  it("gives each pixel with marks once, in order, and only those in the view", () => {
    const marks = Float64Array.from([-5, 0, 0.2, 0.9, 1, 4.5, 4.99, 9.99, 10, 11]);
    expect(cyclePixels(marks, { t0: 0, t1: 10, width: 10 })).toEqual([0, 1, 4, 9]);
    expect(cyclePixels(marks, { t0: 20, t1: 30, width: 10 })).toEqual([]);
  });
  it("costs the pixels, not the marks: a million marks on a 100-pixel view", () => {
    const marks = Float64Array.from({ length: 1_000_000 }, (_, i) => i);
    expect(cyclePixels(marks, { t0: 0, t1: 1_000_000, width: 100 })).toEqual(Array.from({ length: 100 }, (_, i) => i));
  });
});

describe("layoutRowInto", () => {
  it("reuses its columns from row to row, growing them when a row has more marks", () => {
    const n = 1000;
    const s = spans([...new Array(n).fill(0), 1, 1], [...Array.from({ length: n }, (_, i) => 10 * i), 0, 50], [...new Array(n).fill(5), 20, 20]);
    const out = new MarkColumns();
    layoutRowInto(s, 0, { t0: 0, t1: 10 * n, width: 2 * n }, out);
    expect([out.length, out.x[n - 1], out.index[n - 1]]).toEqual([n, 2 * n - 2, n - 1]);
    layoutRowInto(s, 1, { t0: 0, t1: 100, width: 100 }, out);
    expect(Array.from(out.x.subarray(0, out.length))).toEqual([0, 50]);
    expect(layoutRow(s, 1, { t0: 0, t1: 100, width: 100 }).map((m) => m.index)).toEqual([n, n + 1]);
  });
});
