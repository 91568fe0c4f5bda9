/** What an admin API call answered: its status, its body, and the error the body names, if any. */
export interface AdminAnswer {
  status: number;
  text: string;
  error?: { message: string; param: string | null };
}

/** A caller of the gateway's admin API at `base` with `token`, a JSON body when given. */
export function adminCaller(base: string, token: string) {
  return async (method: string, path: string, body?: unknown): Promise<AdminAnswer> => {
    const res = await fetch(`${base}${path}`, {
      method,
      headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    return { status: res.status, text, error: (JSON.parse(text) as Pick<AdminAnswer, 'error'>).error };
  };
}
