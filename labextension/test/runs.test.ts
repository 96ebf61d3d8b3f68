import { describe, expect, it } from 'vitest';

import {
  Answers,
  bytes,
  details,
  duration,
  going,
  heading,
  health,
  liveCount,
  perRankByDefault,
  progress,
  RunRow,
  SessionRow,
  sessionLines,
  statusText
} from '../src/runs';

const running: RunRow = {
  id: 'abc/3',
  kernel: 'abcdef0123456789',
  notebook: 'team/train.ipynb',
  number: 3,
  where: '4 ranks on Spark',
  ranks: 4,
  state: 'running',
  outcome: 'running',
  began: 1_800_000_000,
  seconds: 75.2,
  summary: '4 ranks · 75.2 s',
  has_value: false,
  value: '',
  hosts: ['node-1', 'node-2'],
  step: 120,
  total: 400,
  steps_per_s: 2.345,
  eta: 3725,
  cpu: 97.6,
  memory: 3 * 2 ** 30,
  gpu: '37 %, 1.2/141 GB',
  slow: 'rank 2 on node-2 is a straggler',
  attempt: 'executor lost: attempt 2 of 3'
};

const ended: RunRow = { ...running, state: 'ended', outcome: 'finished', has_value: true, value: "'done'", seconds: 61 };

describe('a run as the panel shows it', () => {
  it('formats times, sizes and progress', () => {
    expect(duration(3725)).toBe('1:02:05');
    expect(duration(42.9)).toBe('0:42');
    expect(duration(null)).toBe('');
    expect(bytes(3 * 2 ** 30)).toBe('3.0 GB');
    expect(bytes(340 * 2 ** 20)).toBe('340 MB');
    expect(progress(running)).toBe('120/400');
    expect(progress({ ...running, total: null })).toBe('120');
    expect(progress({ ...running, step: null })).toBe('');
  });

  it('shows a live run with its hosts, step, rate, ETA and health', () => {
    expect(heading(running)).toBe('#3 team/train.ipynb · 4 ranks on Spark (node-1, node-2) · running');
    expect(going({ ...running, epoch: 1 })).toBe(
      'step 120/400 · epoch 1 · 2.35 steps/s · ETA 1:02:05 · CPU 98 % · mem 3.0 GB · GPU 37 %, 1.2/141 GB'
    );
    expect(details(running)).toEqual(['rank 2 on node-2 is a straggler', 'executor lost: attempt 2 of 3']);
  });

  it('shows an ended run with its outcome, its time and its value', () => {
    expect(heading(ended)).toMatch(/ · finished$/);
    expect(going(ended)).toBe('step 120/400 · took 1:01');
    expect(details(ended)).toContain("rank 0's value: 'done'");
    expect(details({ ...ended, has_value: false })).toContain('no value (it did not finish)');
  });

  it('says what launched a run: its launcher, or the Spark master and the launcher there', () => {
    const launcher = 'Spark Connect sc://spark.example.com:15002 · Horovod (Gloo)';
    expect(details({ ...running, launcher })[0]).toBe(launcher);
    expect(details({ ...ended, launcher: 'local · torch.distributed' })).toEqual([
      'local · torch.distributed',
      'rank 2 on node-2 is a straggler',
      'executor lost: attempt 2 of 3',
      "rank 0's value: 'done'"
    ]);
  });

  it('names the kernel where no notebook is open on it', () => {
    expect(heading({ ...running, notebook: '' })).toMatch(/^#3 kernel abcdef01 · /);
  });

  it('counts the live runs, and shows per-rank curves by default only for small runs', () => {
    expect(liveCount([running, ended, running])).toBe(2);
    expect(health({ ...running, cpu: null, memory: null, gpu: '' })).toBe('');
    expect(perRankByDefault(16)).toBe(true);
    expect(perRankByDefault(64)).toBe(false);
  });
});

describe('a live session as the panel shows it', () => {
  const session: SessionRow = {
    kernel: 'abcdef0123456789',
    notebook: 'team/explore.ipynb',
    where: 'live session, 2 ranks local',
    ranks: 2,
    hosts: ['vm'],
    state: 'idle',
    cells: 4,
    seconds: 125,
    cpu: 1.5,
    memory: 400 * 2 ** 20,
    gpu: '',
    launcher: 'Horovod'
  };

  it('shows its notebook, ranks, hosts, cells, time up and health', () => {
    expect(sessionLines(session)).toEqual([
      'team/explore.ipynb · live session, 2 ranks local (vm) · Horovod',
      'idle · 4 cells · up 2:05 · CPU 2 % · mem 400 MB'
    ]);
  });

  it('counts live runs and sessions in the status bar', () => {
    expect(statusText({ runs: [running, ended], sessions: [session] })).toBe('Horovod: 1 live · 1 session');
    expect(statusText({ runs: [ended], sessions: [] })).toBe('Horovod: 0 live');
  });
});

describe('Answers', () => {
  it('draws an answer only if newer than the last drawn and asked for the view as it is', () => {
    const answers = new Answers<boolean>();
    const everySecond = answers.ask(); // the mean view's ask, still on its way at the click
    const click = answers.ask(); // "Every rank"
    expect(answers.draws(click, true, true)).toBe(true);
    expect(answers.draws(everySecond, false, true)).toBe(false); // late: would draw the mean again
    const next = answers.ask();
    expect(answers.draws(next, true, true)).toBe(true);
    const before = answers.ask(); // asked for every rank, answered after "Mean curve only"
    expect(answers.draws(before, true, false)).toBe(false);
    expect(answers.draws(answers.ask(), false, false)).toBe(true);
  });
});
