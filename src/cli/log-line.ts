import { escapeUnprintable } from '../core/shown-text.js';

/**
 * The log of a running command (`serve`, `epp`, the primary of `--processes`): each message on
 * one line of standard error after `prefix`, every character a terminal would act on escaped,
 * line breaks too. A message may repeat what a peer gave (a worker id from the admin API or from
 * Redis, an engine's error text): escaped here, no message can set a terminal's title, move its
 * cursor, or break its line and forge another, whichever site wrote it, and a log reader takes
 * one line for one message.
 */
export function stderrLog(prefix = ''): (message: string) => void {
  return (message) => process.stderr.write(`${prefix}${escapeUnprintable(message)}\n`);
}
