import { closeSync, constants, fstatSync, openSync, readSync, type Stats } from 'node:fs';

/**
 * Largest tokenizer.json read. Real ones are a few MB to a few tens of MB (Llama 3 ~9 MB,
 * Qwen2.5 ~7 MB, Gemma 3 ~33 MB with its 262k vocabulary); twice the largest leaves room
 * for bigger vocabularies while /dev/zero or a stray dump is refused before it fills memory.
 */
export const MAX_TOKENIZER_JSON_BYTES = 64 * 1024 * 1024;

/**
 * Largest tokenizer_config.json read: special tokens, added tokens and usually the chat
 * template; large ones (many added tokens listed) are about 1-2 MB.
 */
export const MAX_TOKENIZER_CONFIG_BYTES = 16 * 1024 * 1024;

/**
 * Largest chat template read (`--chat-template`, chat_template.jinja): templates are a few
 * KB, the longest (tool-calling ones) some tens of KB.
 */
export const MAX_CHAT_TEMPLATE_BYTES = 1024 * 1024;

/**
 * A regular file's UTF-8 text, refused as a RangeError (`is not a regular file`, `is larger
 * than N bytes`) without reading it whole: a pipe or device could block or never end. The file
 * is opened non-blocking and checked through its descriptor, so a FIFO neither hangs the open
 * nor slips in between a check and the read; a file growing while read stops at the limit.
 * `check` looks at the opened file's status too (its mode, its owner), and throws to refuse it.
 */
export function readRegularFile(file: string, maxBytes: number, check?: (st: Stats) => void): string {
  const fd = openSync(file, constants.O_RDONLY | constants.O_NONBLOCK);
  try {
    const st = fstatSync(fd);
    if (!st.isFile()) throw new RangeError('is not a regular file');
    check?.(st);
    if (st.size > maxBytes) throw new RangeError(`is larger than ${maxBytes} bytes`);
    const chunks: Buffer[] = [];
    let total = 0;
    const buf = Buffer.alloc(64 * 1024);
    for (let n = readSync(fd, buf); n > 0; n = readSync(fd, buf)) {
      total += n;
      if (total > maxBytes) throw new RangeError(`is larger than ${maxBytes} bytes`);
      chunks.push(Buffer.from(buf.subarray(0, n)));
    }
    return Buffer.concat(chunks).toString('utf8');
  } finally {
    closeSync(fd);
  }
}
