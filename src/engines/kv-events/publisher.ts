import { Publisher, Router } from 'zeromq';
import { bindEndpoint } from './bind.js';
import type { KvEventBatch } from './decode.js';
import { encodeEventBatch } from './encode.js';

/**
 * Publishes KV event batches as vLLM's ZmqEventPublisher does: PUB frames
 * [topic, seq (8-byte big-endian), payload], and a ROUTER replay endpoint that answers
 * ["", start_seq] with every buffered [topic, seq, payload] from start_seq on, then
 * ["", -1, ""] (vLLM since vllm-project/vllm#45177); with `replayTopic: false`, as SGLang and
 * older vLLM do, [seq, payload] then [-1, ""]. The mock engine uses it; so do the tests,
 * against the real subscriber.
 */
export interface KvEventPublisherOptions {
  /** Where the PUB socket binds, e.g. tcp://127.0.0.1:5557 (a port of * picks a free one). */
  endpoint: string;
  replayEndpoint?: string;
  /** Batches kept for replay (vLLM's buffer_steps, default 10,000). */
  bufferSize?: number;
  topic?: string;
  encoding?: 'map' | 'array';
  /** Whether replay replies carry the topic frame, as vLLM's do (default true). */
  replayTopic?: boolean;
}

const END_SEQ = Buffer.from([0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);

export class KvEventPublisher {
  private readonly pub = new Publisher({ sendHighWaterMark: 100_000, linger: 0 });
  private replay: Router | undefined;
  /** The replay buffer: a ring of the last `bufferSize` batches (vLLM: a deque with maxlen). */
  private readonly ring: Array<{ seq: bigint; payload: Uint8Array } | undefined>;
  private ringStart = 0;
  private ringCount = 0;
  private nextSeq = 0n;
  private dropCount = 0;
  private closed = false;
  /**
   * The last send: ZeroMQ takes one send at a time on a socket (a second one while the first
   * waits is refused: "Socket is busy writing"), and after 512 sends in one turn of the event
   * loop it makes the next wait, so batches published back to back are sent one after another.
   */
  private sending: Promise<void> = Promise.resolve();
  endpoint = '';
  replayEndpoint = '';

  constructor(private readonly options: KvEventPublisherOptions) {
    const size = options.bufferSize ?? 10_000;
    if (!Number.isInteger(size) || size < 1)
      throw new RangeError(`bufferSize must be a positive integer, got ${options.bufferSize}`);
    this.ring = new Array(size);
  }

  async start(): Promise<this> {
    try {
      await bindEndpoint(this.pub, this.options.endpoint);
      this.endpoint = this.pub.lastEndpoint ?? this.options.endpoint;
      if (this.options.replayEndpoint) {
        this.replay = new Router({ linger: 0 });
        await bindEndpoint(this.replay, this.options.replayEndpoint);
        this.replayEndpoint = this.replay.lastEndpoint ?? this.options.replayEndpoint;
        void this.serveReplays(this.replay);
      }
    } catch (err) {
      // sockets left open would keep the process alive after a failed start
      this.closed = true;
      this.pub.close();
      this.replay?.close();
      throw err;
    }
    return this;
  }

  /** Encodes, numbers, buffers and sends one batch; returns its sequence number. */
  async publish(batch: KvEventBatch): Promise<bigint> {
    const payload = encodeEventBatch(batch, this.options.encoding ?? 'map');
    const seq = this.nextSeq++;
    const cap = this.ring.length;
    if (this.ringCount < cap) this.ring[(this.ringStart + this.ringCount++) % cap] = { seq, payload };
    else {
      this.ring[this.ringStart] = { seq, payload };
      this.ringStart = (this.ringStart + 1) % cap;
    }
    if (this.dropCount > 0) {
      this.dropCount--; // lost on the wire (tests): buffered for replay, never sent
      return seq;
    }
    // an engine's last step can end after its shutdown closed the socket: nothing is left to
    // hear the batch, and a rejection there would crash the process the engine runs in
    if (this.closed) return seq;
    const seqBytes = Buffer.alloc(8);
    seqBytes.writeBigUInt64BE(seq);
    try {
      await this.send([this.options.topic ?? '', seqBytes, payload]);
    } catch (err) {
      if (!this.closed) throw err;
    }
    return seq;
  }

  /** Sends `frames` once the sends before have ended (a socket closed meanwhile sends nothing). */
  private send(frames: Array<Uint8Array | string>): Promise<void> {
    const sent = this.sending.then(() => (this.closed ? undefined : this.pub.send(frames)));
    this.sending = sent.catch(() => {});
    return sent;
  }

  /** Drops the next `count` batches on the wire, as a network loss would (for tests). */
  loseNext(count: number): void {
    this.dropCount += count;
  }

  /** Sends raw frames (for tests of malformed input). */
  async sendRaw(frames: Array<Uint8Array | string>): Promise<void> {
    await this.send(frames);
  }

  async close(): Promise<void> {
    this.closed = true;
    this.pub.close();
    this.replay?.close();
  }

  private async serveReplays(router: Router): Promise<void> {
    const topic = this.options.replayTopic === false ? null : (this.options.topic ?? '');
    try {
      for await (const frames of router) {
        if (frames.length !== 3) continue; // [identity, "", start_seq]
        const [id, , start] = frames;
        if (start.length !== 8) continue;
        const from = start.readBigUInt64BE();
        const cap = this.ring.length;
        // a snapshot: batches published while this replay is sent are not in it
        const batches = Array.from({ length: this.ringCount }, (_, i) => this.ring[(this.ringStart + i) % cap]!);
        for (const b of batches) {
          if (b.seq < from) continue;
          const seqBytes = Buffer.alloc(8);
          seqBytes.writeBigUInt64BE(b.seq);
          await router.send(topic === null ? [id, '', seqBytes, b.payload] : [id, '', topic, seqBytes, b.payload]);
        }
        await router.send(topic === null ? [id, '', END_SEQ, ''] : [id, '', '', END_SEQ, '']);
      }
    } catch (err) {
      if (!this.closed) throw err;
    }
  }
}
