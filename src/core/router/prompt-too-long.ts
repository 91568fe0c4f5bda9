/** Thrown by route() for a prompt longer than the router's `maxPromptTokens`: nothing is recorded for it. */
export class PromptTooLongError extends RangeError {
  override readonly name = 'PromptTooLongError';

  constructor(
    readonly promptTokens: number,
    readonly maxPromptTokens: number,
  ) {
    super(
      `the prompt has ${promptTokens} tokens, more than the ${maxPromptTokens} this router takes (maxPromptTokens)`,
    );
  }
}
