/**
 * Thrown by route() for a prompt longer than the router's `maxPromptTokens`: nothing is recorded
 * for it. `field` names the argument that gave the length when it is a length alone (a request's
 * `promptTokens`, the seed API's `tokenLength`), not the prompt itself; `source` says what of
 * the prompt gave its count when that is not the tokens or text themselves (`blockHashes: 5
 * blocks of 512`).
 */
export class PromptTooLongError extends RangeError {
  override readonly name = 'PromptTooLongError';

  constructor(
    readonly promptTokens: number,
    readonly maxPromptTokens: number,
    field?: string,
    source?: string,
  ) {
    super(
      field === undefined
        ? `the prompt has ${promptTokens} tokens${source === undefined ? '' : ` (${source})`}, more than the ${maxPromptTokens} this router takes (maxPromptTokens)`
        : `${field} must be at most ${maxPromptTokens} (maxPromptTokens), got ${promptTokens}`,
    );
  }
}
