import { escapeUnprintable } from '../core/shown-text.js';

/**
 * The methods each of the gateway's paths is served with, so a request with another method on
 * a served path is answered 405 with an Allow header (RFC 9110 §15.5.6) rather than 404, and a
 * CONNECT (which Node hands over outside the routes) gets an answer at all.
 */

/** One route pattern as Fastify declares it (`/admin/workers/:id`), matched segment by segment. */
interface RoutePattern {
  segments: readonly string[];
  methods: Set<string>;
}

export class RouteMethods {
  private readonly patterns = new Map<string, RoutePattern>();

  /** Records that `url` (a Fastify route pattern) is served with `method`. */
  add(method: string | readonly string[], url: string): void {
    let p = this.patterns.get(url);
    if (p === undefined) this.patterns.set(url, (p = { segments: url.split('/'), methods: new Set() }));
    for (const m of typeof method === 'string' ? [method] : method) p.methods.add(m.toUpperCase());
  }

  /**
   * The route pattern `target` (a request target: a path, with or without a query) matches, as
   * Fastify names a request's route (`req.routeOptions.url`); undefined when none does.
   */
  patternOf(target: string): string | undefined {
    if (!target.startsWith('/')) return undefined;
    const segments = pathSegments(target);
    for (const [url, p] of this.patterns) if (matches(p.segments, segments)) return url;
    return undefined;
  }

  /**
   * The methods `target` (a request target: a path, with or without a query) is served with,
   * sorted; empty when no route matches it (or it is not a path, as a CONNECT's host:port is not).
   */
  allowed(target: string): string[] {
    if (!target.startsWith('/')) return [];
    const segments = pathSegments(target);
    const out = new Set<string>();
    for (const p of this.patterns.values()) if (matches(p.segments, segments)) for (const m of p.methods) out.add(m);
    // Fastify answers HEAD wherever it answers GET
    if (out.has('GET')) out.add('HEAD');
    return [...out].sort();
  }
}

/**
 * The segments of a request target's path as Fastify's router matches it: its query and fragment
 * left out, and percent-decoded (find-my-way decodes the path with decodeURI's rules before it
 * matches, so `/v1/%63ompletions` is `/v1/completions`; a check made before routing that read
 * the path as written would miss the route a request reaches). A path whose encoding is not
 * valid is kept as written: Fastify refuses it.
 */
function pathSegments(target: string): string[] {
  let end = target.length;
  const query = target.indexOf('?');
  if (query !== -1) end = query;
  const fragment = target.indexOf('#');
  if (fragment !== -1 && fragment < end) end = fragment;
  let path = end === target.length ? target : target.slice(0, end);
  if (path.includes('%')) {
    try {
      path = decodeURI(path);
    } catch {
      // a malformed escape: no route matches it as written either
    }
  }
  return path.split('/');
}

/** A pattern's segments against a path's: `:name` matches any non-empty segment, `*` the rest. */
function matches(pattern: readonly string[], path: readonly string[]): boolean {
  for (let i = 0; i < pattern.length; i++) {
    const s = pattern[i];
    if (s === '*') return true;
    if (i >= path.length) return false;
    if (s.startsWith(':') ? path[i] === '' : s !== path[i]) return false;
  }
  return pattern.length === path.length;
}

/** What a request with a method its target is not served with is told. */
export function methodNotAllowedMessage(method: string, target: string, allowed: readonly string[]): string {
  const shown = shownHeader(target);
  return allowed.length === 0
    ? `method ${method} is not supported: the gateway serves its own paths, it is not a proxy (target '${shown}')`
    : `method ${method} is not allowed on ${shown} (allowed: ${allowed.join(', ')})`;
}

/**
 * A header's value or a request target as an error message repeats it: cut to 64 characters,
 * and what a terminal would act on escaped. Node takes bytes 0x80–0xFF in both and reads them
 * as Latin-1, so a client can send C1 controls (U+0085 ends a line for some log readers, U+009B
 * starts a terminal sequence) that JSON leaves raw in an answer and a log line would carry.
 */
export function shownHeader(value: string | undefined): string {
  const v = value ?? '';
  return v.length <= 64 ? escapeUnprintable(v) : `${escapeUnprintable(v.slice(0, 64))}…`;
}
