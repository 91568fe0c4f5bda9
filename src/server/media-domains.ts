/**
 * The hosts a chat's media URLs may name (`--allowed-media-domains`). An engine fetches the
 * `image_url`, `audio_url`, `video_url` and `input_image` URLs of a chat itself: a URL naming
 * 169.254.169.254, localhost or an internal service makes the engine request it (server-side
 * request forgery). vLLM guards this with its own `--allowed-media-domains`; the gateway checks
 * the same thing before any engine sees the request, in one place for every engine behind it.
 *
 * What vLLM does (vllm/multimodal/media/connector.py, MediaConnector, read at commit
 * 959009b402c329c7b885afe7d459726db919a41f; the flag came with vllm-project/vllm#24981):
 * - the list is checked only for a URL whose scheme starts with `http`; an empty list (its
 *   default) checks nothing;
 * - the URL's hostname (urllib3's parse_url) must be a member of the list: an exact match, no
 *   subdomains and no wildcards;
 * - a `data:` URL is decoded in place (base64 only), never fetched; a `file:` URL is read only
 *   under `--allowed-local-media-path` (refused without it), and the domain list does not apply
 *   to it; any other scheme is refused;
 * - the fetch follows redirects unless VLLM_MEDIA_URL_ALLOW_REDIRECTS=0 (vllm/envs.py: on by
 *   default), and a redirect's target is not checked against the list;
 * - GHSA-v359-jj2v-j536 (vllm-project/vllm#34743): a URL that the check's parser and the HTTP
 *   client read as different hosts (`http://a\@b/`) passed the check; vLLM now fetches the URL as
 *   its check parsed it.
 * SGLang has no such setting in its server arguments that we found (sgl-project/sglang#11220,
 * which proposed one, was closed).
 *
 * The gateway forwards the URL as the client wrote it, so it refuses what two parsers could
 * read as different hosts instead of rewriting it: a scheme not followed by `//`, a backslash in
 * the authority, a tab or line break anywhere (WHATWG URL parsing drops them), a `%` in the host.
 * Otherwise it takes the host as WHATWG URL() reads it, which is what an HTTP client connects to:
 * lowercased, IDNA as punycode, IPv4 in its dotted form (0x7f.1 is 127.0.0.1), userinfo split at
 * the last `@` (http://allowed@evil/ is evil). A listed entry is normalised the same way, so the
 * comparison is exact as vLLM's and case-insensitive; a trailing dot is part of the host
 * (a.example. is not a.example), and an IP address passes only when listed itself. With a list,
 * `file:` and every scheme but http, https and data are refused: the gateway cannot know an
 * engine's local-media directory. SGLang's native `/generate` names its media otherwise, in
 * `image_data`, `video_data` and `audio_data`: checkGenerateMedia below.
 */
import { RequestLimitError } from './request-limits.js';

/** Why a media URL was refused: the label `reason` of contextforge_media_url_refusals_total. */
export const MEDIA_URL_REFUSAL_REASONS = ['host', 'scheme', 'malformed'] as const;
export type MediaUrlRefusalReason = (typeof MEDIA_URL_REFUSAL_REASONS)[number];

/** A media URL the allowlist refuses: a 400 naming the field, with why. */
export class MediaUrlRefusal extends RequestLimitError {
  constructor(
    message: string,
    param: string,
    readonly reason: MediaUrlRefusalReason,
  ) {
    super(message, param);
    this.name = 'MediaUrlRefusal';
  }
}

/** The hosts media URLs may name, normalised (normalizeMediaDomain); never empty. */
export type MediaDomains = ReadonlySet<string>;

/** Most entries of the list. */
export const MAX_MEDIA_DOMAINS = 1024;

/**
 * `entry` (a host name or an IP address; an IPv6 address with or without brackets) as URL()
 * reads a URL's host; throws a RangeError saying what is wrong for anything else: a URL, a port,
 * a path, a wildcard or a leading dot (subdomains are not matched, as in vLLM).
 */
export function normalizeMediaDomain(entry: string): string {
  const e = entry.trim();
  if (e === '') throw new RangeError('an empty entry');
  if (e.length > 253 + 2) throw new RangeError(`${JSON.stringify(e.slice(0, 64))}… is longer than a host name`);
  const shown = JSON.stringify(e);
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(e)) throw new RangeError(`${shown} is a URL: list its host name alone`);
  if (e.startsWith('*') || e.startsWith('.'))
    throw new RangeError(`${shown}: list each host name exactly (subdomains are not matched, as in vLLM)`);
  if (/[\s/\\?#@%*]/.test(e)) throw new RangeError(`${shown} is not a host name or an IP address`);
  const colons = e.includes(':');
  if (/^[^:[]+:\d*$/.test(e)) throw new RangeError(`${shown}: list the host name without a port`);
  // an IPv6 address without brackets; with brackets (or a host:port) it is read as given
  const host = colons && !e.startsWith('[') ? `[${e}]` : e;
  let url: URL;
  try {
    url = new URL(`http://${host}/`);
  } catch {
    throw new RangeError(`${shown} is not a host name or an IP address`);
  }
  if (url.port !== '' || (colons && !host.endsWith(']')) || url.pathname !== '/')
    throw new RangeError(`${shown}: list the host name without a port`);
  return url.hostname;
}

/** The list's entries normalised (normalizeMediaDomain), or undefined for an empty list (no restriction). */
export function mediaDomains(entries: readonly string[] | undefined): MediaDomains | undefined {
  if (entries === undefined || entries.length === 0) return undefined;
  if (entries.length > MAX_MEDIA_DOMAINS)
    throw new RangeError(`allowedMediaDomains has more than ${MAX_MEDIA_DOMAINS} entries`);
  const hosts = new Set<string>();
  for (const entry of entries) {
    try {
      hosts.add(normalizeMediaDomain(entry));
    } catch (err) {
      throw new RangeError(`allowedMediaDomains: ${(err as Error).message}`, { cause: err });
    }
  }
  return hosts;
}

/** A URL's field: `at` itself for a URL string, `at.url` for {url}. */
const fieldOf = (at: string, inObject: boolean) => (inObject ? `${at}.url` : at);

/** A URL as a message shows it: at most 100 characters. */
const shownUrl = (url: string) => JSON.stringify(url.length > 100 ? `${url.slice(0, 100)}…` : url);

/** `data:` (any case): decoded by the engine, never fetched, and not parsed here (it may be megabytes). */
const DATA_SCHEME = /^data:/i;
/** http:// or https:// (any case), as written. */
const HTTP_START = /^https?:\/\//i;
/** What WHATWG URL parsing removes from anywhere in a URL: another parser keeps it. */
const TAB_OR_NEWLINE = /[\t\n\r]/;

/**
 * Throws a MediaUrlRefusal naming the field (`at`, or `at.url` when the URL was the `url` of an
 * object) unless `url` is a `data:` URL or an http(s) URL whose host is in `allowed` (see the
 * top of this file). A `data:` URL is looked at by its first five characters only.
 */
export function checkMediaUrl(url: string, at: string, inObject: boolean, allowed: MediaDomains): void {
  if (DATA_SCHEME.test(url)) return;
  const field = fieldOf(at, inObject);
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new MediaUrlRefusal(`${field} is not a valid URL: ${shownUrl(url)}`, field, 'malformed');
  }
  const scheme = parsed.protocol;
  // a data: URL URL() reads past leading whitespace: not fetched either
  if (scheme === 'data:') return;
  if (scheme !== 'http:' && scheme !== 'https:')
    throw new MediaUrlRefusal(
      `${field} is a ${scheme} URL: with --allowed-media-domains only http, https and data URLs are taken`,
      field,
      'scheme',
    );
  if (!HTTP_START.test(url) || TAB_OR_NEWLINE.test(url) || !plainAuthority(url))
    throw new MediaUrlRefusal(
      `${field} is an http(s) URL other parsers may read as another host (a backslash or % in its host part, a tab or line break, or no // after the scheme): ${shownUrl(url)}`,
      field,
      'malformed',
    );
  const host = parsed.hostname;
  if (!allowed.has(host))
    throw new MediaUrlRefusal(
      `${field} names the host ${host}, which is not in --allowed-media-domains`,
      field,
      'host',
    );
}

/**
 * Whether the authority of `url` (an http(s) URL starting with `//` after its scheme), up to
 * the first `/`, `?` or `#`, has no backslash (WHATWG reads one as `/`, Python's urllib and some
 * HTTP clients as part of the userinfo), and its host part (after the last `@`) no `%` (URL()
 * decodes it, another parser may not).
 */
function plainAuthority(url: string): boolean {
  const start = url.indexOf('//') + 2;
  let end = start;
  let at = -1;
  for (; end < url.length; end++) {
    const c = url.charCodeAt(end);
    if (c === 0x2f || c === 0x3f || c === 0x23) break; // / ? #
    if (c === 0x5c) return false; // \
    if (c === 0x40) at = end; // @
  }
  const percent = url.indexOf('%', at === -1 ? start : at + 1);
  return percent === -1 || percent >= end;
}

/**
 * SGLang's native `/generate` media fields (GenerateReqInput in
 * python/sglang/srt/managers/io_struct.py, read at commit
 * 001067fffe33427bee0ed2f007fb7551a1d76b44): `image_data`, `video_data` and `audio_data` each take
 * one item, a list of items (one per prompt, or one prompt's items) or a list of such lists (a
 * batch, several items a prompt); an item is a string, a dict (`{"format": "processor_output"}` or
 * `"precomputed_embedding"` holds no media to load; BaseMultimodalProcessor._load_single_item in
 * python/sglang/srt/multimodal/processors/base_processor.py) or, from Python only, bytes, a PIL
 * image, an ImageData({url}). How SGLang loads a string (python/sglang/srt/utils/common.py, read at
 * commits 004f0c7a8d398a9c4b6844c1d8071502fa88e78c and 4e75f4684b6b67cbb5a02b4106cf1b629d616dba):
 * - load_image: fetches one starting `http://` or `https://` (as written: the prefix test is
 *   case-sensitive); opens one ending in png, jpg, jpeg, webp or gif (any case) as a local file,
 *   before any other test, and `file://` as a local path in newer versions; decodes `data:` and
 *   any other string as base64. An image_data string `video:<path>` is opened as a video file
 *   (BaseMultimodalProcessor.get_estimated_frames_list).
 * - load_video: fetches http(s); decodes `data:`; reads `file://` and any string naming an
 *   existing file (os.path.isfile) as a local file; decodes the rest as base64. A path made of
 *   base64 characters (`/etc//passwd`) is both, so which one SGLang takes depends on the engine's
 *   disk.
 * - load_audio: fetches http(s); decodes `data:`; reads every other string as a local file.
 * With a list, each string SGLang would fetch is checked as a chat's media URL (checkMediaUrl),
 * and so is any other string with a URL scheme (a `file:` URL is refused, as for a chat); a string
 * SGLang could read as a local file is refused: an image_data string ending in an image
 * extension or starting `video:`, and every video_data and audio_data string that is not a
 * `data:` URL (send base64 video or audio as one). A base64 image passes. A dict is checked by its
 * `url` when that is a string (ImageData's field; the gateway does not rely on SGLang refusing
 * it). These fields are bounded by the body limit alone: the walk is over at most two levels of
 * lists, touches each item once and allocates only for the strings it checks as URLs.
 */
export function checkGenerateMedia(body: Readonly<Record<string, unknown>>, allowed: MediaDomains): void {
  checkGenerateMediaField(body.image_data, 'image_data', 'image', allowed);
  checkGenerateMediaField(body.video_data, 'video_data', 'video', allowed);
  checkGenerateMediaField(body.audio_data, 'audio_data', 'audio', allowed);
}

type GenerateMedia = 'image' | 'video' | 'audio';

function checkGenerateMediaField(value: unknown, field: string, kind: GenerateMedia, allowed: MediaDomains): void {
  if (!Array.isArray(value)) {
    checkGenerateMediaItem(value, field, kind, allowed);
    return;
  }
  for (let i = 0; i < value.length; i++) {
    const item: unknown = value[i];
    if (!Array.isArray(item)) {
      checkGenerateMediaItem(item, `${field}[${i}]`, kind, allowed);
      continue;
    }
    for (let j = 0; j < item.length; j++) {
      const inner: unknown = item[j];
      if (Array.isArray(inner))
        throw new RequestLimitError(
          `${field}[${i}][${j}] is a list: SGLang takes an item, a list of items or a list of such lists`,
          `${field}[${i}][${j}]`,
        );
      checkGenerateMediaItem(inner, `${field}[${i}][${j}]`, kind, allowed);
    }
  }
}

/** One item: a string, or a dict checked by its string `url`; anything else is not loaded from a URL or path. */
function checkGenerateMediaItem(item: unknown, at: string, kind: GenerateMedia, allowed: MediaDomains): void {
  if (typeof item === 'string') checkGenerateMediaString(item, at, false, kind, allowed);
  else if (item !== null && typeof item === 'object') {
    const url = (item as { url?: unknown }).url;
    if (typeof url === 'string') checkGenerateMediaString(url, at, true, kind, allowed);
  }
}

/** A URL scheme and its colon at the start of a string; base64 has no colon. */
const SCHEME_START = /^[a-z][a-z0-9+.-]*:/i;

function checkGenerateMediaString(
  s: string,
  at: string,
  inObject: boolean,
  kind: GenerateMedia,
  allowed: MediaDomains,
): void {
  if (s.startsWith('http://') || s.startsWith('https://')) return checkMediaUrl(s, at, inObject, allowed);
  if (kind === 'image') {
    if (s.startsWith('video:')) {
      const path = s.slice(6);
      if (path.startsWith('http://') || path.startsWith('https://')) return checkMediaUrl(path, at, inObject, allowed);
      throw localPath(at, inObject, 'an image_data string starting video: is opened as a video file');
    }
    if (hasImageExtension(s))
      throw localPath(at, inObject, 'SGLang opens an image_data string ending in an image extension as a file');
  }
  if (s.startsWith('data:')) return;
  if (SCHEME_START.test(s)) return checkMediaUrl(s, at, inObject, allowed);
  if (kind !== 'image')
    throw localPath(
      at,
      inObject,
      `SGLang reads a ${kind}_data string that is not an http(s) or data: URL as a file path when one exists${kind === 'video' ? ' (before base64)' : ''}: send base64 ${kind} as a data: URL`,
    );
}

/** Whether `s` ends in png, jpg, jpeg, webp or gif, in any case (load_image's file-name test). */
function hasImageExtension(s: string): boolean {
  const n = s.length;
  if (n < 3) return false;
  const tail = s.slice(Math.max(0, n - 4)).toLowerCase();
  return tail.endsWith('png') || tail.endsWith('jpg') || tail === 'jpeg' || tail === 'webp' || tail.endsWith('gif');
}

function localPath(at: string, inObject: boolean, why: string): MediaUrlRefusal {
  const field = fieldOf(at, inObject);
  return new MediaUrlRefusal(
    `${field} could be read as a local file path, which --allowed-media-domains refuses (${why})`,
    field,
    'scheme',
  );
}
