/**
 * A base URL without its credentials, and the Basic authorization they stand for: HTTP
 * clients (fetch, undici) refuse or ignore URLs with credentials, so they travel as a header.
 * RangeError when they do not decode (a `%` not followed by two hex digits).
 */
export function splitCredentials(url: string): { url: string; authorization?: string } {
  const u = new URL(url);
  if (u.username === '' && u.password === '') return { url };
  let userPass: string;
  try {
    userPass = `${decodeURIComponent(u.username)}:${decodeURIComponent(u.password)}`;
  } catch {
    // (worker-input.ts refuses such a URL where it is given; the credentials are not repeated)
    throw new RangeError('a user name or password in the URL has a malformed percent-escape');
  }
  const authorization = `Basic ${Buffer.from(userPass).toString('base64')}`;
  u.username = '';
  u.password = '';
  return { url: u.toString(), authorization };
}
