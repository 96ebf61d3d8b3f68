import { describe, expect, it } from 'vitest';

import { bannerText } from '../src/cells';
import { RunRow } from '../src/runs';

const run: RunRow = {
  id: 'k/2',
  kernel: 'k',
  notebook: 'train.ipynb',
  number: 2,
  where: '2 ranks local',
  ranks: 2,
  state: 'running',
  outcome: 'running',
  began: 0,
  seconds: 3,
  summary: '',
  has_value: false,
  value: '',
  cell: 'c1',
  step: 40,
  total: 100
};

describe("a reopened notebook's cell whose run went on without it", () => {
  it('says the run goes on, where, and how to see it', () => {
    expect(bannerText(run)).toBe(
      'hvd_magic: run 2 of this cell goes on at step 40/100; its live view: click here (or the Horovod panel)'
    );
  });

  it("says how an unseen run ended, with rank 0's value", () => {
    const ended = { ...run, state: 'ended' as const, outcome: 'finished', has_value: true, value: "'done'" };
    expect(bannerText(ended)).toBe(
      "hvd_magic: run 2 of this cell finished, rank 0's value: 'done'; its record: click here (or %horovod last)"
    );
  });
});
