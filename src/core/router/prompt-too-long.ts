/**
 * Thrown by route() for a prompt longer than the router's `maxPromptTokens`: nothing is recorded
 * for it. `field` names the argument that gave the length when it is a length alone (a request's
 * `promptTokens`, the seed API's `tokenLength`), not the prompt itself.
 */
export class PromptTooLongError extends RangeError {
  override readonly name = 'PromptTooLongError';

  constructor(
    readonly promptTokens: number,
    readonly maxPromptTokens: number,
    field?: string,
  ) {
    super(
      field === undefined
        ? `the prompt has ${promptTokens} tokens, more than the ${maxPromptTokens} this router takes (maxPromptTokens)`
        : `${field} must be at most ${maxPromptTokens} (maxPromptTokens), got ${promptTokens}`,
    );
  }
}
