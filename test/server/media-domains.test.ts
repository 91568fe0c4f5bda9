/**
 * --allowed-media-domains at the gateway: with a list, a chat's media URLs (image_url,
 * audio_url, video_url, input_image; every message, every part) must name a listed host, as
 * vLLM's flag of that name requires, or the request is a 400 naming the field and the host,
 * refused before any engine sees it; data: URLs pass; file: and other schemes are refused. A
 * request that passes is forwarded as the client wrote it. SGLang's `/generate` (read by the
 * endpoint picker) has its image_data, video_data and audio_data checked the same way, and a
 * string SGLang could read as a local file refused. Without a list nothing changes.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { KVAwareRouter } from '../../src/index.js';
import { createGateway, type Gateway } from '../../src/server/gateway.js';
import { mediaDomains, normalizeMediaDomain } from '../../src/server/media-domains.js';
import { post, recordingEngine, type FakeEngine } from '../faults/harness.js';

const received: string[] = [];
let engine: FakeEngine;
let listed: Gateway;
let open: Gateway;
let listedUrl = '';
let openUrl = '';

before(async () => {
  engine = await recordingEngine(received);
  const common = { workers: [{ id: 'e0', url: engine.url }], metricsIntervalMs: 0, healthCheckIntervalMs: 0 };
  listed = await createGateway({
    router: new KVAwareRouter(),
    allowedMediaDomains: ['images.example', 'CDN.Example.org', 'bücher.example', '10.0.0.7', '::1'],
    ...common,
  });
  open = await createGateway({ router: new KVAwareRouter(), ...common });
  listedUrl = await listed.app.listen({ host: '127.0.0.1', port: 0 });
  openUrl = await open.app.listen({ host: '127.0.0.1', port: 0 });
});
after(async () => {
  await listed?.close(0);
  await open?.close(0);
  await engine?.close();
});

const CHAT = '/v1/chat/completions';
// the fast path, and Fastify's route (a query string takes a request past the fast path)
const TARGETS = [CHAT, `${CHAT}?via=fastify`];

/** A chat whose third message's first part is `part`, after a system message and a text-only user turn. */
const chatText = (part: unknown) =>
  JSON.stringify({
    model: 'm',
    max_tokens: 1,
    messages: [
      { role: 'system', content: 'look closely' },
      { role: 'user', content: [{ type: 'text', text: 'first' }] },
      { role: 'user', content: [part, { type: 'text', text: 'what is it?' }] },
    ],
  });

const imageUrl = (url: string) => ({ type: 'image_url', image_url: { url } });

/** POSTs `text` to the listed gateway at `path`; asserts a 400 before any engine and returns its error. */
async function refused(text: string, path = CHAT): Promise<{ message: string; param: string }> {
  const before = received.length;
  const res = await post(listedUrl, path, text);
  assert.equal(res.status, 400, res.text);
  assert.equal(received.length, before, 'no engine saw the request');
  return (JSON.parse(res.text) as { error: { message: string; param: string } }).error;
}

/** POSTs `text` to `base` at `path`; asserts a 200 and that the engine got the body byte for byte. */
async function forwardedAsWritten(base: string, text: string, path = CHAT): Promise<void> {
  const before = received.length;
  const res = await post(base, path, text);
  assert.equal(res.status, 200, res.text);
  assert.equal(received.length, before + 1);
  assert.equal(received[before], text);
}

describe('with --allowed-media-domains', () => {
  test('a URL of a listed host is forwarded as written, in every media part kind', async () => {
    const parts = [
      imageUrl('https://images.example/cat.png?size=2'),
      { type: 'image_url', image_url: 'https://images.example/cat.png' },
      { type: 'audio_url', audio_url: { url: 'http://cdn.example.org/a.wav' } },
      { type: 'video_url', video_url: { url: 'https://cdn.example.org:8443/v.mp4' } },
      { type: 'input_image', image_url: 'https://images.example/x.png' },
      { image_url: 'https://images.example/no-type.png' },
      { type: 'image_url', image_url: { url: 'https://images.example/y.png' }, uuid: 'u1' },
      // cached media by uuid: no URL to fetch
      { type: 'image_url', image_url: null, uuid: 'u2' },
      // host names compared as URL() reads them: any case, IDNA as punycode
      imageUrl('https://IMAGES.Example/upper.png'),
      imageUrl('https://xn--bcher-kva.example/b.png'),
      imageUrl('https://bücher.example/b.png'),
      // userinfo is not the host
      imageUrl('https://evil.example@images.example/u.png'),
      // IP addresses listed as such
      imageUrl('http://10.0.0.7/i.png'),
      imageUrl('http://[::1]:8000/i.png'),
      // data: URLs are not fetched
      imageUrl('data:image/png;base64,iVBORw0KGgo='),
      { type: 'input_image', image_url: 'DATA:image/png;base64,AAAA' },
      imageUrl(' data:image/png;base64,AAAA'),
    ];
    for (const target of TARGETS) for (const part of parts) await forwardedAsWritten(listedUrl, chatText(part), target);
  });

  test('a URL naming any other host is a 400 naming the field and the host', async () => {
    const cases: Array<[unknown, string, string]> = [
      [imageUrl('https://evil.example/x.png'), '.image_url.url', 'evil.example'],
      // cloud metadata, loopback, a name that only resolves inside
      [imageUrl('http://169.254.169.254/latest/meta-data/'), '.image_url.url', '169.254.169.254'],
      [imageUrl('http://localhost:8080/admin'), '.image_url.url', 'localhost'],
      [imageUrl('http://127.0.0.1/'), '.image_url.url', '127.0.0.1'],
      // 0x7f.1 and 2130706433 are 127.0.0.1 to URL() and to the resolver
      [imageUrl('http://0x7f.1/'), '.image_url.url', '127.0.0.1'],
      [imageUrl('http://2130706433/'), '.image_url.url', '127.0.0.1'],
      [imageUrl('http://[::2]/'), '.image_url.url', '[::2]'],
      // the listed host as userinfo: the host is what follows the last @
      [imageUrl('http://images.example@169.254.169.254/'), '.image_url.url', '169.254.169.254'],
      [imageUrl('http://images.example:pw@evil.example/'), '.image_url.url', 'evil.example'],
      [imageUrl('http://a@images.example@evil.example/'), '.image_url.url', 'evil.example'],
      // exact match: no subdomains, no suffix tricks, a trailing dot is another name (as in vLLM)
      [imageUrl('https://sub.images.example/x.png'), '.image_url.url', 'sub.images.example'],
      [imageUrl('https://images.example.evil.example/x.png'), '.image_url.url', 'images.example.evil.example'],
      [imageUrl('https://images.example./x.png'), '.image_url.url', 'images.example.'],
      [imageUrl('https://IMAGES.EXAMPLE./x.png'), '.image_url.url', 'images.example.'],
      [imageUrl('https://EVIL.example/x.png'), '.image_url.url', 'evil.example'],
      [{ type: 'image_url', image_url: 'http://evil.example/' }, '.image_url', 'evil.example'],
      [{ type: 'audio_url', audio_url: { url: 'http://evil.example/a.wav' } }, '.audio_url.url', 'evil.example'],
      [{ type: 'video_url', video_url: 'http://evil.example/v.mp4' }, '.video_url', 'evil.example'],
      [{ type: 'input_image', image_url: 'http://evil.example/i.png' }, '.image_url', 'evil.example'],
      [{ video_url: { url: 'http://evil.example/v.mp4' } }, '.video_url.url', 'evil.example'],
      [{ image_url: { url: 'http://evil.example/' }, uuid: 'u3' }, '.image_url.url', 'evil.example'],
    ];
    for (const target of TARGETS)
      for (const [part, field, host] of cases) {
        const error = await refused(chatText(part), target);
        assert.equal(error.param, `messages[2].content[0]${field}`, JSON.stringify(part));
        assert.equal(
          error.message,
          `messages[2].content[0]${field} names the host ${host}, which is not in --allowed-media-domains`,
        );
      }
  });

  test('file:, ftp: and other schemes, unparseable and ambiguous URLs are refused naming the field', async () => {
    const cases: Array<[string, RegExp]> = [
      ['file:///etc/passwd', /is a file: URL: with --allowed-media-domains only http, https and data URLs/],
      ['ftp://images.example/x.png', /is a ftp: URL/],
      [' http://169.254.169.254/', /other parsers may read as another host/],
      ['gopher://images.example/', /is a gopher: URL/],
      ['javascript:alert(1)', /is a javascript: URL/],
      ['images.example/x.png', /is not a valid URL: "images\.example\/x\.png"/],
      ['http://', /is not a valid URL/],
      ['', /is not a valid URL/],
      // what two parsers may read as two hosts
      ['http://169.254.169.254\\@images.example/', /other parsers may read as another host/],
      ['http://images.example\\@169.254.169.254/', /other parsers may read as another host/],
      ['http:images.example/x.png', /other parsers may read as another host/],
      ['http:/images.example/x.png', /other parsers may read as another host/],
      ['http://images.example\t/x.png', /other parsers may read as another host/],
      ['http://images%2Eexample/x.png', /other parsers may read as another host/],
    ];
    for (const [url, message] of cases) {
      const error = await refused(chatText(imageUrl(url)));
      assert.equal(error.param, 'messages[2].content[0].image_url.url', url);
      assert.match(error.message, /^messages\[2\]\.content\[0\]\.image_url\.url /);
      assert.match(error.message, message, url);
    }
  });

  test('every message and part is checked: a bad URL after good ones is refused', async () => {
    const text = JSON.stringify({
      model: 'm',
      messages: [
        { role: 'user', content: [imageUrl('https://images.example/1.png')] },
        { role: 'assistant', content: 'a cat' },
        {
          role: 'user',
          content: [
            'plain',
            imageUrl('https://images.example/2.png'),
            { type: 'audio_url', audio_url: 'http://169.254.169.254/' },
          ],
        },
      ],
    });
    const error = await refused(text);
    assert.equal(error.param, 'messages[2].content[2].audio_url');
  });

  test('a completion (no media) is forwarded as written', async () => {
    await forwardedAsWritten(
      listedUrl,
      '{"model":"m","prompt":"http://169.254.169.254/ says","max_tokens":1}',
      '/v1/completions',
    );
    // a URL in a chat's text is not fetched by anyone
    await forwardedAsWritten(
      listedUrl,
      JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'see http://169.254.169.254/' }] }),
    );
  });

  test('refusals are counted by reason', async () => {
    const page = await (await fetch(`${listedUrl}/metrics`)).text();
    for (const reason of ['host', 'scheme', 'malformed'])
      assert.match(page, new RegExp(`^contextforge_media_url_refusals_total\\{reason="${reason}"\\} [1-9]\\d*$`, 'm'));
  });
});

describe('without --allowed-media-domains', () => {
  test('every media URL is forwarded as written', async () => {
    for (const url of [
      'http://169.254.169.254/latest/meta-data/',
      'file:///etc/passwd',
      'ftp://x/y',
      'http://127.0.0.1\\@images.example/',
    ])
      await forwardedAsWritten(openUrl, chatText(imageUrl(url)));
  });

  test('the refusals counter shows 0', async () => {
    const page = await (await fetch(`${openUrl}/metrics`)).text();
    assert.match(page, /^contextforge_media_url_refusals_total\{reason="host"\} 0$/m);
  });
});

describe('the list itself', () => {
  test('entries are normalised as URL() reads a host', () => {
    assert.equal(normalizeMediaDomain('Images.Example'), 'images.example');
    assert.equal(normalizeMediaDomain(' bücher.example '), 'xn--bcher-kva.example');
    assert.equal(normalizeMediaDomain('::1'), '[::1]');
    assert.equal(normalizeMediaDomain('[::1]'), '[::1]');
    assert.equal(normalizeMediaDomain('10.0.0.7'), '10.0.0.7');
    assert.equal(mediaDomains([]), undefined);
    assert.equal(mediaDomains(undefined), undefined);
  });

  test('a URL, a port, a path, a wildcard or a leading dot is refused with what is wrong', () => {
    const cases: Array<[string, RegExp]> = [
      ['https://images.example', /is a URL: list its host name alone/],
      ['images.example:443', /without a port/],
      ['images.example/x', /is not a host name or an IP address/],
      ['*.images.example', /subdomains are not matched/],
      ['.images.example', /subdomains are not matched/],
      ['user@images.example', /is not a host name or an IP address/],
      ['', /an empty entry/],
      ['exa mple', /is not a host name or an IP address/],
    ];
    for (const [entry, message] of cases) {
      assert.throws(() => normalizeMediaDomain(entry), message, entry);
      assert.throws(() => mediaDomains([entry]), /^RangeError: allowedMediaDomains: /, entry);
    }
  });

  test('createGateway refuses a bad list', async () => {
    await assert.rejects(
      createGateway({ router: new KVAwareRouter(), allowedMediaDomains: ['*.example'], metricsIntervalMs: 0 }),
      /allowedMediaDomains: "\*\.example": list each host name exactly/,
    );
  });
});

describe('the endpoint picker reads requests with the gateway parser', () => {
  test('a media URL outside the list is refused there too, naming the field and the host', async () => {
    const body = JSON.parse(chatText(imageUrl('http://169.254.169.254/latest/meta-data/'))) as Record<string, unknown>;
    const refusal = await listed.parseRequest(CHAT, { body, headers: {} });
    assert.ok('status' in refusal, 'refused');
    assert.equal(refusal.status, 400);
    assert.equal(refusal.param, 'messages[2].content[0].image_url.url');
    assert.match(refusal.message, /169\.254\.169\.254/);
    const allowed = JSON.parse(chatText(imageUrl('https://images.example/cat.png'))) as Record<string, unknown>;
    assert.ok(!('status' in (await listed.parseRequest(CHAT, { body: allowed, headers: {} }))), 'listed host passes');
  });
});

describe("SGLang's /generate media fields (image_data, video_data, audio_data)", () => {
  const GENERATE = '/generate';
  const parse = (gateway: Gateway, fields: Record<string, unknown>) =>
    gateway.parseRequest(GENERATE, { body: { text: 'look <image>', ...fields }, headers: {} });
  /** Asserts `fields` are refused by the listed gateway naming `param`, with a message matching `message`. */
  async function refusedGenerate(fields: Record<string, unknown>, param: string, message: RegExp): Promise<void> {
    const refusal = await parse(listed, fields);
    assert.ok('status' in refusal, `refused: ${JSON.stringify(fields).slice(0, 200)}`);
    assert.equal(refusal.status, 400);
    assert.equal(refusal.param, param, refusal.message);
    assert.match(refusal.message, message);
  }
  async function passes(gateway: Gateway, fields: Record<string, unknown>): Promise<void> {
    const parsed = await parse(gateway, fields);
    assert.ok(!('status' in parsed), `passes: ${'status' in parsed ? parsed.message : ''}`);
  }
  const PNG_B64 = 'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg==';

  test('http(s) URLs naming an unlisted host are refused naming the field, in every form SGLang takes', async () => {
    const evil = 'http://169.254.169.254/latest/meta-data/';
    await refusedGenerate({ image_data: evil }, 'image_data', /169\.254\.169\.254.*not in --allowed-media-domains/);
    await refusedGenerate({ image_data: ['https://images.example/a.png', evil] }, 'image_data[1]', /169\.254/);
    await refusedGenerate(
      { image_data: [['https://images.example/a.png'], [PNG_B64, evil]] },
      'image_data[1][1]',
      /169\.254/,
    );
    await refusedGenerate({ image_data: [{ url: evil, detail: 'auto' }] }, 'image_data[0].url', /169\.254/);
    await refusedGenerate({ image_data: { url: evil } }, 'image_data.url', /169\.254/);
    await refusedGenerate({ video_data: [evil] }, 'video_data[0]', /169\.254/);
    await refusedGenerate({ audio_data: 'https://localhost/a.wav' }, 'audio_data', /localhost/);
    await refusedGenerate({ image_data: 'http://127.0.0.1\\@images.example/' }, 'image_data', /other parsers/);
    await refusedGenerate({ image_data: 'file:///etc/passwd' }, 'image_data', /file: URL/);
    await refusedGenerate({ image_data: 'ftp://images.example/a' }, 'image_data', /ftp: URL/);
  });

  test('what SGLang would read as a local file path is refused', async () => {
    // load_image opens a string ending in an image extension as a file
    await refusedGenerate({ image_data: '/etc/secret.png' }, 'image_data', /file path/);
    await refusedGenerate({ image_data: [PNG_B64, 'cat.JPG'] }, 'image_data[1]', /file path/);
    await refusedGenerate({ image_data: 'video:/data/clip.mp4' }, 'image_data', /file path/);
    // load_video reads an existing file before base64, load_audio every other string
    await refusedGenerate({ video_data: '/etc//passwd' }, 'video_data', /file path/);
    await refusedGenerate({ audio_data: [['/etc/passwd']] }, 'audio_data[0][0]', /file path/);
  });

  test('listed hosts, data: URLs and base64 images pass; so do preprocessed inputs', async () => {
    await passes(listed, {
      image_data: [
        ['https://images.example/a.png', 'http://cdn.example.org/b'],
        [`data:image/png;base64,${PNG_B64}`, PNG_B64, { url: 'https://images.example/c' }, null],
      ],
      video_data: ['data:video/mp4;base64,AAAA', 'https://images.example/v.mp4'],
      audio_data: 'data:audio/wav;base64,UklGRg==',
    });
    await passes(listed, { image_data: [{ format: 'precomputed_embedding', feature: [[0.5]] }] });
    await passes(listed, { image_data: null, video_data: [], audio_data: [] });
  });

  test('a list nested deeper than SGLang takes is refused', async () => {
    const refusal = await parse(listed, { image_data: [[['https://images.example/a.png']]] });
    assert.ok('status' in refusal);
    assert.equal(refusal.param, 'image_data[0][0]');
  });

  test('without a list nothing is checked', async () => {
    await passes(open, {
      image_data: ['http://169.254.169.254/', '/etc/secret.png'],
      video_data: '/etc/passwd',
      audio_data: [['file:///etc/passwd']],
    });
  });

  test('refusals are counted', async () => {
    const count = async () =>
      Number(
        /^contextforge_media_url_refusals_total\{reason="host"\} (\d+)$/m.exec(
          await (await fetch(`${listedUrl}/metrics`)).text(),
        )?.[1],
      );
    const before = await count();
    await refusedGenerate({ image_data: 'http://10.0.0.8/' }, 'image_data', /10\.0\.0\.8/);
    assert.equal(await count(), before + 1);
  });
});
