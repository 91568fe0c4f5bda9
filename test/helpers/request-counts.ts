/** Every contextforge_requests_total sample of /v1/completions in a /metrics text, as status: count. */
export async function completionCounts(metrics: () => Promise<string>): Promise<Record<string, number>> {
  const counts: Record<string, number> = {};
  for (const line of (await metrics()).split('\n')) {
    const m = /^contextforge_requests_total\{path="\/v1\/completions",status="(\d+)"\} (\d+)$/.exec(line);
    if (m) counts[m[1]] = Number(m[2]);
  }
  return counts;
}
