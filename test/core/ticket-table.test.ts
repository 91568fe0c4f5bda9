/**
 * The router's table of open tickets: what it holds matches a Map through any order of opens
 * and releases, at the counts a busy gateway keeps open, past the table's doublings and past
 * ticket numbers beyond 2^32.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { createRng } from '../../src/core/rng.js';
import { TicketTable } from '../../src/core/router/in-flight.js';
import { WorkerRegistry } from '../../src/core/worker-registry.js';

const registry = new WorkerRegistry();
const workers = [registry.register('w0'), registry.register('w1')];

function check(table: TicketTable, model: Map<number, number>, probes: number[]): void {
  assert.equal(table.size, model.size);
  for (const ticket of probes) {
    const t = table.get(ticket);
    const slot = model.get(ticket);
    if (slot === undefined) assert.equal(t, undefined, `ticket ${ticket} released`);
    else assert.equal(t?.worker, workers[slot], `ticket ${ticket} open`);
  }
}

for (const [name, first] of [
  ['from 1', 1],
  ['past 2^32', 2 ** 32 - 5000],
] as const) {
  test(`open and released tickets, in order and at random, match a Map (${name})`, () => {
    const rng = createRng(7);
    const table = new TicketTable();
    const model = new Map<number, number>();
    let next = first;
    const opened: number[] = [];
    const open = () => {
      const slot = next % 2;
      table.open(next, workers[slot]);
      model.set(next, slot);
      opened.push(next++);
    };
    // a burst held open (doublings), released oldest first, as a queue drains
    for (let i = 0; i < 20_000; i++) open();
    check(
      table,
      model,
      opened.filter((_, i) => i % 97 === 0),
    );
    for (let i = 0; i < 15_000; i++) {
      table.delete(opened[i]);
      model.delete(opened[i]);
    }
    check(
      table,
      model,
      opened.filter((_, i) => i % 89 === 0),
    );
    // then opens and releases at random, released twice and unknown tickets included
    for (let step = 0; step < 60_000; step++) {
      const r = rng();
      if (r < 0.5) open();
      else {
        const ticket = opened[Math.floor(rng() * opened.length)];
        table.delete(ticket);
        model.delete(ticket);
      }
    }
    table.delete(next + 1000);
    check(table, model, opened);
    for (const ticket of opened) table.delete(ticket);
    assert.equal(table.size, 0);
    check(
      table,
      new Map(),
      opened.filter((_, i) => i % 13 === 0),
    );
  });
}
