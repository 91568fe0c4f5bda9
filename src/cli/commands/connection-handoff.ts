import type { ChildProcess } from 'node:child_process';
import type { Worker } from 'node:cluster';

/**
 * node:cluster's round-robin scheduling (the default but on Windows): the primary accepts each
 * connection and hands it to one gateway process over its IPC channel (an internal `newconn`
 * message carrying the socket, numbered `seq`), and closes its own copy of the socket only when
 * that process answers (`ack: seq`: taken, or given to another process when it was refused).
 * A process killed (SIGKILL, a crash) between the two never answers, and Node keeps the copy
 * open for as long as the primary runs: the connection stays established with no process to
 * read it, and its client waits for ever for an answer or a reset.
 *
 * This watches the sockets handed to `worker` and closes those it never answered for once it
 * has exited and its channel is read to its end (ChildProcess 'close': an answer it sent before
 * it died is read first, and a socket it refused goes to another process, not closed). The
 * client of such a connection gets a reset (its request, unread, was not served). In case
 * 'close' does not come, they are closed HANDOFF_CLOSE_AFTER_EXIT_MS after the exit.
 *
 * It relies on Node's internal messages (`cmd: 'NODE_CLUSTER'`), unchanged from Node 12 to 24;
 * a message of another shape is passed on untouched, so a Node that changes them only loses
 * this repair.
 */
export function closeUnansweredHandoffs(worker: Worker): void {
  const child = worker.process as ChildProcess;
  /** Sockets handed to the process and not yet answered for, by the message's seq. */
  const unanswered = new Map<number, Closable>();
  const send = child.send as (...args: unknown[]) => boolean;
  child.send = function (this: ChildProcess, ...args: unknown[]): boolean {
    const [message, handle] = args;
    if (isHandoff(message) && isClosable(handle)) unanswered.set(message.seq, handle);
    return send.apply(this, args);
  } as ChildProcess['send'];
  child.on('internalMessage', (m: unknown) => {
    if (isAnswer(m)) unanswered.delete(m.ack);
  });
  let closed = false;
  const closeUnanswered = () => {
    if (closed) return;
    closed = true;
    for (const handle of unanswered.values()) handle.close();
    unanswered.clear();
  };
  child.once('close', closeUnanswered);
  child.once('exit', () => setTimeout(closeUnanswered, HANDOFF_CLOSE_AFTER_EXIT_MS).unref());
}

/** How long after a process exits the sockets it never answered for are closed when its channel's end was not read by then. */
export const HANDOFF_CLOSE_AFTER_EXIT_MS = 1000;

interface Closable {
  close(): void;
}

function isClosable(h: unknown): h is Closable {
  return h !== null && typeof h === 'object' && typeof (h as { close?: unknown }).close === 'function';
}

/** Node's message handing a connection to a process: { cmd: 'NODE_CLUSTER', act: 'newconn', seq }. */
function isHandoff(m: unknown): m is { seq: number } {
  if (m === null || typeof m !== 'object') return false;
  const x = m as { cmd?: unknown; act?: unknown; seq?: unknown };
  return x.cmd === 'NODE_CLUSTER' && x.act === 'newconn' && typeof x.seq === 'number';
}

/** A process's answer to one of the primary's messages: { cmd: 'NODE_CLUSTER', ack: seq }. */
function isAnswer(m: unknown): m is { ack: number } {
  if (m === null || typeof m !== 'object') return false;
  const x = m as { cmd?: unknown; ack?: unknown };
  return x.cmd === 'NODE_CLUSTER' && typeof x.ack === 'number';
}
