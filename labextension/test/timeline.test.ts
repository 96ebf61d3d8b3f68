import { describe, expect, it } from 'vitest';

import { decode, TimelineModel, WindowAnswer } from '../src/timeline';

const base64 = (bytes: number[]) => btoa(String.fromCharCode(...bytes));

describe('the timeline model the tab feeds the notebook viewer', () => {
  it('sets every trait before any change event, binary ones as DataViews', () => {
    const model = new TimelineModel(() => Promise.reject(new Error('not asked')));
    const seen: string[] = [];
    for (const name of ['row_names', 'starts', 'end_us']) {
      model.on(`change:${name}`, () => {
        // the viewer reloads on the first change: everything must be there already
        expect(model.get('end_us')).toBe(9);
        expect(model.get('starts')).toBeInstanceOf(DataView);
        seen.push(name);
      });
    }
    model.update({
      version: 1,
      said: '',
      traits: { row_names: ['allreduce.w'], end_us: 9, starts: base64([0, 0, 0, 0, 0, 0, 240, 63]) },
      binary: ['starts']
    });
    expect(seen).toEqual(['row_names', 'end_us', 'starts']);
    expect(model.get('starts').getFloat64(0, true)).toBe(1);
    expect(model.get('row_names')).toEqual(['allreduce.w']);
  });

  it('sends a window request and hands the reply back as the kernel would', async () => {
    const asked: object[] = [];
    const answer: WindowAnswer = { reply: { type: 'spans', id: 3 }, buffers: [base64([1, 2]), ''] };
    const model = new TimelineModel(content => {
      asked.push(content);
      return Promise.resolve(answer);
    });
    const replies: [object, DataView[]][] = [];
    const callback = (content: object, buffers: DataView[]) => replies.push([content, buffers]);
    model.on('msg:custom', callback);
    model.send({ type: 'window', id: 3 });
    await new Promise(resolve => setTimeout(resolve, 0));
    expect(asked).toEqual([{ type: 'window', id: 3 }]);
    expect(replies[0][0]).toEqual({ type: 'spans', id: 3 });
    expect(replies[0][1].map(view => view.byteLength)).toEqual([2, 0]);
    model.off('msg:custom', callback);
    model.send({ type: 'window', id: 4 });
    await new Promise(resolve => setTimeout(resolve, 0));
    expect(replies).toHaveLength(1);
  });

  it('decodes base64 into the bytes sent', () => {
    const view = decode(base64([7, 0, 255]));
    expect([view.getUint8(0), view.getUint8(1), view.getUint8(2)]).toEqual([7, 0, 255]);
  });
});
