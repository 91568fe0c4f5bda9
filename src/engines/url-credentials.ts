/**
 * A base URL without its credentials, and the Basic authorization they stand for: HTTP
 * clients (fetch, undici) refuse or ignore URLs with credentials, so they travel as a header.
 */
export function splitCredentials(url: string): { url: string; authorization?: string } {
  const u = new URL(url);
  if (u.username === '' && u.password === '') return { url };
  const authorization = `Basic ${Buffer.from(`${decodeURIComponent(u.username)}:${decodeURIComponent(u.password)}`).toString('base64')}`;
  u.username = '';
  u.password = '';
  return { url: u.toString(), authorization };
}
