/**
 * The bytes of gRPC messages that have begun to arrive but not ended, charged to the body budget.
 *
 * grpc-js reads a message's 5-byte prefix (a flag and the length, big-endian), then holds what
 * arrives of it in its decoder until the message is whole, and only then hands it to the picker.
 * Those bytes are nobody's to count: the receive limit bounds one message, not how many streams
 * hold one each. A peer that sends most of a large message on each of many streams and holds
 * them open held 2.6 GB with 300 streams on two connections, past every limit. So the picker
 * follows the same framing on each stream's bytes as they arrive (a listener of its own on the
 * HTTP/2 stream, put before grpc-js's decoder) and charges what an unfinished message holds to a
 * budget (the picker's: `--buffered-body-limit`, beside the one the handler charges the bodies it
 * buffers to), giving it back once the message is whole (grpc-js hands it to the handler) or the
 * stream ends. A stream whose unfinished message does not fit is reset (HTTP/2
 * ENHANCE_YOUR_CALM): it cannot be answered, as its request has not been read. A message that
 * arrives whole in one read is never charged.
 */
import { constants, type Http2Server, type ServerHttp2Stream } from 'node:http2';
import type { Server } from '@grpc/grpc-js';
import type { BodyBudget } from '../server/body-budget.js';

/** gRPC's message prefix: a compressed flag byte and a 4-byte big-endian length. */
const PREFIX_BYTES = 5;

/**
 * Charges the unfinished messages of every stream of the HTTP/2 servers `server` has now (its
 * connection injectors' included) to `budget`; `onRefused` hears of each stream reset for not
 * fitting. False when grpc-js keeps its HTTP/2 servers otherwise than this reads them (a grpc-js
 * release that changed it): nothing is charged then.
 */
export function chargePartialMessages(server: Server, budget: BodyBudget, onRefused: () => void): boolean {
  // grpc-js's own map of the HTTP/2 servers it created (private: no public API hands them out)
  const servers = (server as unknown as { http2Servers?: unknown }).http2Servers;
  if (!(servers instanceof Map)) return false;
  for (const http2Server of servers.keys() as IterableIterator<Http2Server>)
    http2Server.on('stream', (stream: ServerHttp2Stream) => chargeStream(stream, budget, onRefused));
  return true;
}

/** Follows one stream's message framing; charges what its unfinished message holds. */
function chargeStream(stream: ServerHttp2Stream, budget: BodyBudget, onRefused: () => void): void {
  /** Bytes of the current message's prefix read (0 to PREFIX_BYTES; 0 between messages). */
  let prefix = 0;
  /** The current message's length, once its prefix is read. */
  let length = 0;
  /** Bytes of the current message's payload read. */
  let read = 0;
  /** Bytes charged to the budget for the current message. */
  let charged = 0;
  let refused = false;
  const settle = (held: number): boolean => {
    if (held > charged) {
      if (!budget.take(held - charged)) return false;
    } else if (held < charged) budget.give(charged - held);
    charged = held;
    return true;
  };
  stream.prependListener('data', (chunk: Buffer) => {
    if (refused) return;
    let i = 0;
    while (i < chunk.length) {
      if (prefix < PREFIX_BYTES) {
        // the flag byte first, then the length's four bytes
        if (prefix > 0) length = length * 256 + chunk[i];
        prefix++;
        i++;
      } else {
        const n = Math.min(length - read, chunk.length - i);
        read += n;
        i += n;
      }
      if (prefix === PREFIX_BYTES && read === length) prefix = length = read = 0;
    }
    if (settle(prefix === 0 ? 0 : prefix + read)) return;
    refused = true;
    settle(0);
    onRefused();
    stream.close(constants.NGHTTP2_ENHANCE_YOUR_CALM);
  });
  stream.once('close', () => settle(0));
}
